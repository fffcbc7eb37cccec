"""Checks of the mechanism from its releases: the noise's scale and freshness on every parameter
tensor, and the batch sizes against the accountant's Poisson sampling.

:class:`NoiseChecks` folds each release ``r_t`` (DP-SGD: the noisy sum; DP-FedAvg: the noisy
sum recovered from the model delta, ``(Delta_t - beta Delta_{t-1})``) into two sums of squares
per parameter tensor, on the release's device and with no host synchronisation: ``||r_t||^2``
(noise scale, F1) and ``||r_t - r_{t-1}||^2`` (fresh noise, F2). Every tensor's sums come from
one flat buffer by a fixed number of ops (one norm over its rows, one cumulative sum, one
matrix-vector product: :meth:`NoiseChecks._energies`): the ops a release costs do not grow with
the number of tensors, on the CPU (where a per-tensor or ``_foreach_norm`` norm runs one norm a
tensor) as on a GPU. :class:`SamplerCheck` keeps the real batch size of every DP-SGD step. Their tests are
:func:`~audit_callbacks.estimators.mechanism_checks.noise_energy_check` and
:func:`~audit_callbacks.estimators.mechanism_checks.sampler_check`; the laws, false-alarm rates
and power are in ``docs/methods/mechanism_checks.md``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from audit_callbacks import names
from audit_callbacks.estimators.mechanism_checks import noise_energy_check, sampler_check
from audit_callbacks.estimators.result import AuditResult

__all__ = ["NoiseChecks", "SamplerCheck"]

#: Entries per row of the noise checks' buffer: each row is normed by one op, the rows' squares
#: are summed in float64.
CHUNK = 256


class NoiseChecks:
    """Per-tensor sums of squares of the releases (F1) and of their differences (F2).

    Args:
        tensors: ``[(name, numel)]`` of the flat released vector's parameter tensors, in order
            (their sizes sum to d).
        noise_std: ``s`` on the scale of the folded vector: ``noise_multiplier * clip norm``
            for a noisy sum; ``noise_multiplier * clip_norm * server_lr / divisor`` for a
            DP-FedAvg model delta.
        reads: ``"noisy_sum"`` or ``"model_delta"``.
        momentum: the server momentum beta of a DP-FedAvg release (the folded vector is
            ``Delta_t - beta Delta_{t-1}``), 0 otherwise.
        what: a release's name in sentences (``"step"`` or ``"round"``).
        extra_tensors: ``[(name, numel)]`` of arrays released beside the vector that carry no
            canary (a Flower model's integer buffers): each release's ``extras`` (their change,
            flat) is checked with the same noise, as further groups (no momentum).
    """

    name = "noise_checks"
    state_key = "noise_checks"

    def __init__(self, tensors: Sequence[tuple[str, int]], noise_std: float, *,
                 reads: str = "noisy_sum", momentum: float = 0.0, what: str = "step",
                 extra_tensors: Sequence[tuple[str, int]] = ()) -> None:
        tensors = [*tensors, *extra_tensors]
        self.names = [str(n) for n, _ in tensors]
        self.sizes = [int(s) for _, s in tensors]
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError("tensors must name at least one tensor, each with numel >= 1")
        self.extra = sum(int(s) for _, s in extra_tensors)
        self._first_extra = len(self.sizes) - len(extra_tensors)
        self._extra_views: list[torch.Tensor] = []
        self.dim = sum(self.sizes) - self.extra  # the released vector's; the extras follow it
        self.noise_std = float(noise_std)
        self.reads = reads
        self.momentum = float(momentum)
        self.what = what
        self._buffers: dict[str, torch.Tensor] | None = None

    def _on(self, like: torch.Tensor) -> dict[str, torch.Tensor]:
        buf = self._buffers
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        if buf is not None and buf["cur"].device == like.device and buf["cur"].dtype == dtype:
            return buf
        dev, m = like.device, len(self.sizes)
        old = buf
        # cur and diff are one buffer of rows of CHUNK entries, so that one norm covers both:
        # a zero row, then for each of cur and diff its rows (zero-padded) and one "tail" row a
        # boundary between tensors (see _energies); e and n hold the noise-scale half first,
        # the fresh-noise half second
        full = self.dim + self.extra
        chunks, ends = -(-full // CHUNK), m + 1
        block = chunks + ends
        both = torch.zeros((1 + 2 * block) * CHUNK, dtype=dtype, device=dev)
        blocks = both[CHUNK:].view(2, block, CHUNK)
        starts = np.concatenate(([0], np.cumsum(self.sizes)))  # each tensor's first entry, and the end
        first = 1 + block * np.arange(2)[:, None]  # each half's first row
        row = first + starts[None, :] // CHUNK  # [2, m + 1]: the row of each boundary
        tail = first + chunks + np.arange(ends)[None, :]  # its tail row
        # E = P(end) - P(start), P(x) = cums[row(x) - 1] + (cums[tail(x)] - cums[tail(x) - 1]);
        # tail(j + 1) - 1 = tail(j)
        terms = np.stack((row[:, 1:] - 1, row[:, :-1] - 1, tail[:, 1:], tail[:, :-1], tail[:, :-1] - 1), -1)
        # the tail rows by one gather from the buffer: entry c of boundary j's tail row is entry c
        # of the row the boundary falls in where c is before the boundary, else the zero row's
        before = np.arange(CHUNK)[None, None, :] < (starts % CHUNK)[None, :, None]  # [1, m + 1, CHUNK]
        picks = np.where(before, row[:, :, None] * CHUNK + np.arange(CHUNK), 0)  # [2, m + 1, CHUNK]
        buf = {
            "both": both, "cur": blocks[0].reshape(-1)[:full], "diff": blocks[1].reshape(-1)[:full],
            "rows": both.view(-1, CHUNK), "tails": blocks[:, chunks:],
            "picks": torch.as_tensor(picks, dtype=torch.int64, device=dev),
            "terms": torch.as_tensor(terms.reshape(-1, 5), dtype=torch.int64, device=dev),
            "signs": torch.tensor([1.0, -1.0, 1.0, -2.0, 1.0], dtype=torch.float64, device=dev),
            "zero64": torch.zeros((), dtype=torch.float64, device=dev),
            # NaN until a release is held (and after a restart): the first difference is then
            # not finite, so not counted (the gate of the fresh-noise half)
            "prev": torch.full((full,), math.nan, dtype=dtype, device=dev),
            "delta": torch.zeros(self.dim, dtype=dtype, device=dev),
            "e": torch.zeros(2 * m, dtype=torch.float64, device=dev),
            "n": torch.zeros(2, dtype=torch.float64, device=dev),
            "norms64": torch.zeros(1 + 2 * block, dtype=torch.float64, device=dev),
            "cums": torch.zeros(1 + 2 * block, dtype=torch.float64, device=dev),
            "terms5": torch.zeros(2 * m, 5, dtype=torch.float64, device=dev),
            "squares": torch.zeros(2 * m, dtype=torch.float64, device=dev),
            "masked": torch.zeros(2, m, dtype=torch.float64, device=dev),
            "counted64": torch.zeros(2, dtype=torch.float64, device=dev),
        }
        # the prefix sums at each half's last row (its sum of squares, tails included, plus the
        # halves before it): finite exactly when every tensor's sum of the half and of the
        # halves before it is (see fold)
        buf["ends"] = buf["cums"].as_strided((2,), (block,), block)
        buf["squares2"], buf["e2"] = buf["squares"].view(2, m), buf["e"].view(2, m)
        if old is not None:  # a model moved to another device (or dtype): the sums go on, and
            # the previous delta (NaN after a resume: the next release is not folded) with them
            buf["e"].copy_(old["e"].to(dev))
            buf["n"].copy_(old["n"].to(dev))
            buf["delta"].copy_(old["delta"].to(device=dev, dtype=dtype))
        buf["integral"] = torch.zeros(len(self.sizes) - self._first_extra, dtype=torch.int64, device=dev)
        if old is not None:
            buf["integral"].copy_(old["integral"].to(dev))
        self._buffers = buf
        self._extra_views = list(torch.split(buf["cur"], self.sizes))[self._first_extra:]
        return buf

    def fold(self, release: Any) -> torch.Tensor:
        """Fold one release (its ``vector`` ``[d]``); a release with NaN or inf entries is not
        folded and does not become the previous release. Returns the 0-dim bool flag."""
        vec = release.vector
        if vec.numel() != self.dim:
            raise ValueError(f"the release has {vec.numel()} entries, the tensors {self.dim}")
        vec = vec if vec.dim() == 1 else vec.reshape(-1)
        b = self._on(vec)
        if vec.dtype != b["cur"].dtype:  # a half-precision release: compared in float32
            vec = vec.to(b["cur"].dtype)
        cur = b["cur"]
        head = cur[:self.dim] if self.extra else cur
        if self.momentum:
            # the previous delta only counts once one was released: until then (and after a
            # restart) it is zeros, and vec - beta * 0 is vec, bit for bit (no mask a release)
            torch.sub(vec, b["delta"], alpha=self.momentum, out=head)
            b["delta"].copy_(vec)
        else:
            head.copy_(vec)
        if self.extra:
            extras = getattr(release, "extras", None)
            if extras is None or extras.numel() != self.extra:
                cur[self.dim:].fill_(float("nan"))  # not released with it: not counted
            else:
                cur[self.dim:].copy_(extras.reshape(-1))
                # an integer buffer's change with no fractional part: its noise was rounded away
                whole = torch.stack([(v == v.round()).all() for v in self._extra_views])
                b["integral"].add_(whole.to(torch.int64))
        torch.sub(cur, b["prev"], out=b["diff"])
        squares = self._energies(b)  # [2, m]
        # counted = [ok, ok & a finite difference], ok: every sum of the release is finite. The
        # sums are differences of the prefix sums of non-negative squares, so they are all
        # finite exactly when the prefix sum at the half's last row is (a NaN or inf square
        # makes that one and a sum that reads it non-finite; finite squares of float32 cannot
        # overflow a float64 sum); the fresh-noise half's prefix sums include the release's.
        # Without a previous release prev is NaN, so the difference is not finite: no gate.
        # A non-finite release becomes the previous one too: the next difference is then not
        # finite and skipped, and the one after is whole again (no conditional copy of d values)
        counted = torch.lt(b["ends"], math.inf)
        torch.lt(b["ends"], math.inf, out=b["counted64"])
        b["e2"].add_(torch.where(counted.as_strided((2, 1), (1, 1)), squares, b["zero64"], out=b["masked"]))
        b["n"].add_(b["counted64"])
        b["prev"].copy_(cur)
        return counted.as_strided((), ())  # counted[0] (a new tensor each fold)

    def _energies(self, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[2, m]`` float64: each tensor's sum of squares in ``cur``, then in ``diff``, in a
        fixed number of ops whatever m (a per-tensor norm costs one op a tensor on the CPU).

        The buffer's rows of :data:`CHUNK` entries are normed by one op (float32 within a row,
        about 1e-7 of a row's sum) and their squares summed cumulatively in float64; a tensor's sum is the difference of
        the prefix sums at its two ends. The prefix sum at a boundary inside a row is the sum of
        the rows before it plus the squares of the row's entries before the boundary: these
        are gathered into the boundary's own tail row of the buffer before the norm (one
        ``torch.take``, whose index reads the zero row for the entries after the boundary, so
        that a non-finite one does not reach it). Each sum reads
        5 prefix sums (one matrix-vector product with weights 1, -1, 1, -2, 1), all of its own
        half: a non-finite ``diff`` never reaches the sums of ``cur``; a non-finite entry of
        ``cur`` makes its tensor's sum and the later ones non-finite (the release is then not
        folded, as before)."""
        torch.take(b["both"], b["picks"], out=b["tails"])
        rows = b["rows"]
        norms = torch.linalg.vector_norm(rows, dim=1)
        # the squares (float32: x * x, as square_), then their float64 cumulative sum, through
        # reused buffers (the conversion inside cumsum(dtype=) costs four events)
        b["norms64"].copy_(norms.mul_(norms))
        cums = torch.cumsum(b["norms64"], 0, out=b["cums"])
        # the 5 prefix sums of each tensor's sum, weighted: mv(take(cums, terms), signs), as
        # the addmv with beta = 0 that mv dispatches (the same product), into reused buffers
        torch.addmv(b["squares"], torch.take(cums, b["terms"], out=b["terms5"]), b["signs"], beta=0,
                    out=b["squares"])
        return b["squares2"]

    def restart(self) -> None:
        """A new fit: the next release has no predecessor (the server momentum restarts)."""
        if self._buffers is not None:
            self._buffers["prev"].fill_(math.nan)
            self._buffers["delta"].zero_()

    def counts(self) -> tuple[int, int]:
        """Releases and differences folded so far (reads the device back)."""
        if self._buffers is None:
            return 0, 0
        n1, n2 = self._buffers["n"].tolist()
        return int(n1), int(n2)

    def results(self, alpha: float) -> dict[str, AuditResult]:
        """``{noise_scale_ratio, fresh_noise_ratio}``: the noise-scale and fresh-noise checks at
        level ``alpha`` over every release so far (each from 1 release / 1 difference on)."""
        if self._buffers is None:
            return {}
        n1, n2 = self.counts()
        e1, e2 = np.split(self._buffers["e"].cpu().numpy().copy(), 2)
        # an integer buffer released with no fractional change in every release: its noise was
        # cast to the integer (Flower #4868); below a std of 1 that leaves most draws 0 (all
        # below 1/2 when rounded; 70% at 0.95 truncated toward zero, as numpy's astype does), so
        # its noise part is taken as 0
        if self.noise_std < 1.0 and n1 >= 2:
            integral = self._buffers["integral"].cpu().numpy()
            for j in np.flatnonzero(integral >= n1):
                e1[self._first_extra + j] = e2[self._first_extra + j] = 0.0
        sizes = np.asarray(self.sizes, dtype=np.float64)
        out = {}
        if n1:
            out[names.NOISE_SCALE_RATIO] = noise_energy_check(e1, sizes * n1, self.noise_std, alpha=alpha,
                                                    check="noise_scale", groups=self.names)
        if n2:
            out[names.FRESH_NOISE_RATIO] = noise_energy_check(e2, sizes * n2, self.noise_std, alpha=alpha,
                                                    check="fresh_noise", groups=self.names)
        for res in out.values():
            res.details["releases"] = n1 if res.details["check"] == "noise_scale" else n2
        return out

    def state_dict(self) -> dict[str, Any]:
        """The sums and counts (never a released vector)."""
        if self._buffers is None:
            return {}
        e1, e2 = np.split(self._buffers["e"].cpu().numpy(), 2)
        n1, n2 = self.counts()
        return {"e1": e1.tolist(), "e2": e2.tolist(), "n1": n1, "n2": n2,
                "integral": self._buffers["integral"].cpu().tolist(),
                "tensors": [list(x) for x in zip(self.names, self.sizes, strict=True)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the first release after a resume has no predecessor (and,
        with server momentum, no known noise part: it is not folded)."""
        if not state:
            return
        saved = [(str(n), int(s)) for n, s in state["tensors"]]
        if saved != list(zip(self.names, self.sizes, strict=True)):
            raise ValueError("the checkpoint's noise checks cover other parameter tensors")
        b = self._on(torch.empty(0))
        b["e"].copy_(torch.tensor(list(state["e1"]) + list(state["e2"]), dtype=torch.float64))
        b["n"].copy_(torch.tensor([float(state["n1"]), float(state["n2"])], dtype=torch.float64))
        if "integral" in state:  # (a checkpoint before it was kept: the counts restart at 0)
            b["integral"].copy_(torch.tensor(state["integral"], dtype=torch.int64))
        if self.momentum:
            # the server's momentum goes on from the delta before the checkpoint, which is not
            # kept: the first release's noise part vec - beta * delta is then unknown, so it is
            # left out of both checks (NaN: not folded), as a new fit's first difference is
            b["delta"].fill_(math.nan)


class SamplerCheck:
    """The real batch sizes of the DP-SGD steps, tested against Poisson sampling at the rate the
    accountant is charged.

    Only their histogram is kept, per (population, rate): the order of the steps is not needed
    by the test, and no step's size is written anywhere but the checkpoint.

    Args:
        population: N, the training examples (None: unknown, no test).
    """

    name = "sampler_check"
    state_key = "sampler_check"
    reads = "noisy_sum"

    def __init__(self, population: int | None) -> None:
        self.population = population
        #: (population, rate, size) -> steps; population is N times the Poisson batches summed
        #: into the step (gradient accumulation), rate the rate of each of them
        self.histogram: Counter[tuple[int, float, int]] = Counter()
        self._true = torch.ones((), dtype=torch.bool)  # fold's flag, made once (no op a step)

    def fold(self, release: Any) -> torch.Tensor:
        """Count the step's real batch size (host only); returns a shared 0-dim True (never
        modify it)."""
        size = getattr(release, "batch_size", None)
        rate = getattr(release, "batch_rate", None)  # the real examples' rate, where it differs
        if rate is None:
            rate = getattr(release, "rate", None)
        if size is not None and rate is not None and self.population:
            batches = max(1, int(getattr(release, "batches", 1) or 1))
            self.histogram[(int(self.population) * batches, float(rate) / batches, int(size))] += 1
        return self._true

    def results(self, alpha: float) -> dict[str, AuditResult]:
        """``{batch_size_variance_ratio}``: the sampler check over the steps of the most common
        (population, rate), from 2 steps on."""
        by_key: Counter[tuple[int, float]] = Counter()
        for (n, q, _), count in self.histogram.items():
            by_key[(n, q)] += count
        if not by_key:
            return {}
        (n, q), steps = by_key.most_common(1)[0]
        if steps < 2 or not 0.0 < q < 1.0:
            return {}
        sizes = np.concatenate([np.full(c, s) for (n2, q2, s), c in sorted(self.histogram.items())
                                if (n2, q2) == (n, q)])
        k = n // self.population if self.population and n % self.population == 0 else 1  # accumulated batches
        return {names.BATCH_SIZE_VARIANCE_RATIO: sampler_check(sizes.astype(np.float64), n, q, alpha=alpha,
                                                               batches_per_step=k)}

    def state_dict(self) -> dict[str, Any]:
        """The histogram of batch sizes (counts of the sampler's draws, no example)."""
        return {"histogram": [[n, q, s, c] for (n, q, s), c in sorted(self.histogram.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.histogram = Counter({(int(n), float(q), int(s)): int(c)
                                      for n, q, s, c in state["histogram"]})
