"""Opacus DP-SGD glue (torch + Opacus, no Lightning): find the run's ``DPOptimizer``, its
accountant and sampling rate, chain its step hook, and add gradient canaries before clipping.

Everything here works on the objects Opacus' ``PrivacyEngine.make_private`` returns; nothing is
replaced that Opacus relies on:

* the accountant keeps its single ``step_hook`` slot: :func:`chain_step_hook` installs a hook that
  calls the previous one first (``previous`` stays reachable for :func:`find_accountant`);
* gradient canaries go in through :class:`GradientCanaryInjector`, which wraps the
  optimizer's ``clip_and_accumulate`` and ``add_noise`` on the instance: once per logical step
  the joining canaries, at a norm well above ``max_grad_norm``, are clipped by the optimizer's
  own ``clip_and_accumulate`` as per-example gradients of one flat parameter ``[d]`` (a fixed
  number of ops whatever the number of parameter tensors) and their clipped sum added to every
  ``p.summed_grad``, so that Opacus' own clipping, summation, noise and
  ``1 / expected_batch_size`` scaling act on each as on a real example (a clipping bug moves the
  estimates); where the optimizer has no per-example gradients to extend (ghost clipping,
  per-layer or adaptive clipping) ``max_grad_norm * c_j`` is added to the clipped sum in
  ``add_noise`` instead; under data-parallel training (Opacus' ``DistributedDPOptimizer``) on
  rank 0 only, so that each canary enters the all-reduced gradient once
  (:func:`canary_placement`). Which canaries join a step is drawn by the training loader's own
  Poisson sampler where it is Opacus' (:mod:`audit_callbacks.backends.opacus.sampling`), else by the
  audit at the accountant's rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from opacus.optimizers import DPOptimizer

from audit_callbacks.backends.opacus.buffers import FlatGather
from audit_callbacks.backends.opacus.placement import (
    _supported_distributed,
    canary_placement,
    preclip_unsupported,
)
from audit_callbacks.backends.opacus.sampling import LoaderCanarySampling
from audit_callbacks.canary.vectors import CanarySet


def _tensors(grad_sample: Any) -> list[torch.Tensor] | None:
    """The tensors of a ``p.grad_sample`` (a tensor, or a list of them under accumulation)."""
    if isinstance(grad_sample, torch.Tensor):
        return [grad_sample]
    if isinstance(grad_sample, list) and grad_sample and all(isinstance(t, torch.Tensor) for t in grad_sample):
        return list(grad_sample)
    return None


def _uniform(layout: list[tuple[torch.Tensor, torch.device, torch.dtype]]) -> bool:
    """Whether every parameter and its per-example gradients share one device and one dtype
    (the canary rows can then be clipped as one flat parameter)."""
    _, device, dtype = layout[0]
    return all(p.device == device == d and p.dtype == dtype == t
               and isinstance(getattr(p, "summed_grad", None), torch.Tensor)
               and p.summed_grad.dtype == dtype and p.summed_grad.device == device
               for p, d, t in layout)


class _FlatCanaryParameter:
    """A stand-in parameter ``[d]`` for the canary rows' clipping call, its summed-gradient
    buffer ``[d]`` and that buffer's per-parameter views (made once)."""

    def __init__(self, params: list[torch.Tensor], dtype: torch.dtype) -> None:
        device = params[0].device
        self.shapes = [(p.shape, p.device) for p in params]
        self.dtype = dtype
        d = sum(p.numel() for p in params)
        # a leaf that requires a gradient, as Opacus' ``params`` keeps only those; never stepped
        self.param = torch.nn.Parameter(torch.empty(d, dtype=dtype, device=device))
        self.summed = torch.zeros(d, dtype=dtype, device=device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            self.views.append(self.summed[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()

    def fits(self, params: list[torch.Tensor], dtype: torch.dtype) -> bool:
        """Whether these buffers serve ``params`` (their shapes, devices and dtype)."""
        return dtype == self.dtype and [(p.shape, p.device) for p in params] == self.shapes


class GradientCanaryInjector:
    """Insert example-level gradient canaries into a ``DPOptimizer`` (Andrew et al., ICLR 2024,
    with a canary in the place of a training example).

    Where a canary enters (``insertion``). By default **before clipping**: the optimizer's
    ``clip_and_accumulate`` is wrapped on the instance (so a subclass's or an instance's own
    override still runs on the canaries too), and at the first ``clip_and_accumulate`` of each
    logical step, right after the real examples' call, it is called a second time on one row
    per joining canary, ``norm_multiplier * max_grad_norm * c_j``: by default with the
    parameters presented as one flat parameter ``[d]`` whose ``grad_sample`` is the rows
    ``[m, d]`` (:meth:`_clip_canaries_flat`: a fixed number of ops, the clipped sum added to
    every ``p.summed_grad`` by one ``_foreach_add_``), or, where the parameters differ in
    device or dtype or ``flat_rows`` is False, with every ``p.grad_sample`` set to the rows cut
    into the parameter's shape (:meth:`_clip_canaries`, about ten ops a parameter tensor). Either
    way Opacus' own per-sample norm, clip factor ``min(1, C / (norm + 1e-6))`` and summation
    into ``p.summed_grad`` (then its noise and scaling) act on it as on a real example, and with
    correct clipping the canary adds ``max_grad_norm * c_j`` (times ``1 - 1e-6 /
    (norm_multiplier C)``) to the summed gradient; clipping at 2C doubles it. The two ways give
    the same sum up to the float32 rounding of the rows' norms (the flat row's norm, or the
    norm of its per-parameter norms: about 1e-7 relative). The real
    per-example gradients are never copied or extended (concatenating the rows to them
    would copy all B x d every step) and are put back right after the
    canaries' call (the same objects, marked processed by Opacus' first call), so
    ``accumulated_iterations`` and the label attacks' step hooks see the real examples only.
    ``BatchMemoryManager`` calls ``clip_and_accumulate`` once per physical batch: the canaries go
    into the first. Where the optimizer has no per-example gradients to extend (ghost clipping,
    per-layer clipping, AdaClip: :func:`preclip_unsupported`) or ``before_clipping=False``, the
    canaries go **after clipping**, as before: ``max_grad_norm * c_j`` added to ``p.summed_grad``
    in ``add_noise``; ``insertion`` then says why.

    Who joins a logical step. Without ``sampling``, each observed canary ``j < num_observed``
    joins independently with probability ``q = min(1, sample_rate * accumulated_iterations)``,
    the rate the accountant is charged for, drawn from ``numpy.random.default_rng([seed, 0xA7,
    t])`` at step ``t``. With ``sampling`` (:class:`~audit_callbacks.backends.opacus.sampling.
    LoaderCanarySampling`) the training loader's own Poisson sampler draws them, and the step
    takes the draws of its ``accumulated_iterations`` batches (a canary drawn in two accumulated
    batches enters twice, as a real example would). Participations are counted when the step is
    released (``add_noise``).

    Data-parallel training (Opacus' ``DistributedDPOptimizer``, the optimizer ``make_private``
    returns for a ``DPDDP`` model): every rank makes the same draws and counts the same
    participations, but only rank 0 inserts the canaries, so that after Opacus' all-reduce each
    canary has the weight of one real example's clipped gradient (:func:`canary_placement`).
    ``sample_rate`` is then the rate of one example in the *global* logical batch.

    Observer (e.g. the backend's release of the noisy sum to the auditor): called once
    per logical step as ``observer(noisy_sum, rate)``, where ``noisy_sum`` ``[d]`` is the
    concatenation of ``p.grad`` over ``optimizer.params`` (in order) right after Opacus' own
    ``add_noise``: the summed clipped gradients, canaries included, plus ``N(0, sigma^2 C^2)``
    noise, before ``scale_grad`` divides it; ``rate`` is the step's ``q = min(1, sample_rate *
    accumulated_iterations)`` (the accountant's). Under data-parallel training the observer is
    called right after Opacus' ``reduce_gradients`` (wrapped on the instance while an observer is
    set), with the all-reduced gradient multiplied back by what Opacus divided it by
    (``expected_batch_size * accumulated_iterations * world_size`` for ``loss_reduction="mean"``,
    1 for ``"sum"``), so every rank sees the same global noisy sum. With no observer nothing is
    wrapped or computed beyond the canaries. ``noisy_sum`` is a buffer the injector reuses from
    step to step (one copy a step): an observer that keeps it must copy it.

    Attributes:
        flat_rows: True (default): the canary rows are clipped as one flat parameter where the
            parameters allow it; set False to clip them one block a parameter.
        insertion: ``"before clipping"`` or ``"after clipping: <reason>"``.

    Args:
        optimizer: the run's ``DPOptimizer``; its ``add_noise`` (and ``clip_and_accumulate``)
            are wrapped on the instance.
        canaries: the canary set, dimension = total number of the optimizer's parameters.
        num_observed: k, canaries ``0..k-1`` may join; the rest are never inserted.
        sample_rate: the accountant's Poisson rate of one example per physical batch (global
            batch).
        seed: the seed of the join draws.
        world_size: the number of training processes (``trainer.world_size``).
        observer: ``observer(noisy_sum [d], rate)`` called once per logical step (see above),
            or None (default); :meth:`set_observer` changes it later.
        norm_multiplier: a canary's norm before clipping in units of ``max_grad_norm``, >= 1
            (``CanaryAuditConfig.canary_norm_multiplier``, default 10).
        before_clipping: insert before clipping where the optimizer allows it (default True).
        sampling: the loader's canary draws, or None (the audit draws at ``sample_rate``).

    Raises:
        ValueError: the canary dimension does not match the parameters, a rate not in (0, 1],
            a ``norm_multiplier`` below 1 or not finite, a ``sampling`` over another k.
        RuntimeError: a data-parallel run the canaries cannot audit (:func:`canary_placement`).
    """

    def __init__(
        self, optimizer: DPOptimizer, canaries: CanarySet, num_observed: int, sample_rate: float,
        *, seed: int = 0, world_size: int = 1,
        observer: Callable[[torch.Tensor, float], None] | None = None,
        norm_multiplier: float = 10.0, before_clipping: bool = True,
        sampling: LoaderCanarySampling | None = None,
    ) -> None:
        if observer is not None and not callable(observer):
            raise ValueError(f"observer must be callable or None, got {type(observer).__name__}")
        dim = sum(p.numel() for p in optimizer.params)
        if dim != canaries.dim:
            raise ValueError(f"canaries have dimension {canaries.dim}, the optimizer's parameters {dim}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if not (isinstance(norm_multiplier, (int, float)) and math.isfinite(norm_multiplier)
                and norm_multiplier >= 1):
            raise ValueError(f"norm_multiplier must be a finite number >= 1, got {norm_multiplier!r}")
        if sampling is not None and sampling.num_canaries != int(num_observed):
            raise ValueError(f"sampling draws {sampling.num_canaries} canaries, num_observed is {num_observed}")
        self.inserts, self.scale = canary_placement(optimizer, int(world_size))
        self.world_size = int(getattr(optimizer, "world_size", world_size))
        self.optimizer = optimizer
        self.canaries = canaries
        self.num_observed = int(num_observed)
        self.sample_rate = float(sample_rate)
        self.seed = int(seed)
        self.norm_multiplier = float(norm_multiplier)
        self.sampling = sampling
        self.steps = 0
        self.participations = np.zeros(self.num_observed, dtype=np.int64)
        reason = "before_clipping=False" if not before_clipping else preclip_unsupported(optimizer)
        self.before_clipping = reason is None
        #: "before clipping", or "after clipping: <reason>"
        self.insertion = "before clipping" if reason is None else f"after clipping: {reason}"
        self._joined: np.ndarray | None = None  # the current logical step's canaries
        self._rate = 0.0
        self._placed = False  # the current step's rows are in (or there were none to put in)
        self._rows_buffer: torch.Tensor | None = None  # the canary rows, reused across steps
        # per number of rows m: (the buffer's first m rows, each parameter's [m, *p.shape] view
        # of them), made once per m and buffer (no view ops per step)
        self._row_views: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._row_slices: dict[int, torch.Tensor] = {}  # the buffer's first m rows, per m
        #: the flat parameter, its ``summed_grad`` buffer [d] and that buffer's per-parameter
        #: views (see :meth:`_clip_canaries_flat`)
        self._flat: _FlatCanaryParameter | None = None
        #: True (default): the canary rows go through the optimizer's clipping as one flat
        #: parameter (a fixed number of ops) wherever the parameters share one device and
        #: dtype; False: always as one block a parameter (about ten ops a parameter tensor)
        self.flat_rows = True
        self._noisy = FlatGather()  # the noisy sum given to the observer, reused across steps
        #: the last logical step's real batch size (None: not counted) and its Poisson batches
        self.last_batch_size: int | None = None
        self.last_batches = 1
        #: physical batches over all logical steps taken (gradient accumulation: several a step)
        self.batches_total = 0
        self._batch_size, self._batch_seen, self._batches = 0, False, 1
        # instance attributes (the class is untouched); an instance's own are put back at detach
        self._own = {name: optimizer.__dict__.get(name) for name in ("add_noise", "clip_and_accumulate")}
        self._original = optimizer.add_noise
        optimizer.add_noise = self._add_noise
        self._clip_original: Callable[[], None] | None = None
        if self.before_clipping:
            self._clip_original = optimizer.clip_and_accumulate
            optimizer.clip_and_accumulate = self._clip_and_accumulate
        self._distributed = isinstance(optimizer, _supported_distributed())
        self.observer: Callable[[torch.Tensor, float], None] | None = None
        self._reduce_original: Callable[[], None] | None = None
        self._awaiting: tuple[float, float] | None = None  # (rate, factor) until the all-reduce
        self.set_observer(observer)

    def set_observer(self, observer: Callable[[torch.Tensor, float], None] | None) -> None:
        """Install (or with None remove) the observer of the noisy sums (see the class)."""
        if observer is not None and not callable(observer):
            raise ValueError(f"observer must be callable or None, got {type(observer).__name__}")
        self.observer = observer
        opt = self.optimizer
        if self._distributed and observer is not None and self._reduce_original is None:
            self._reduce_original = opt.reduce_gradients
            opt.reduce_gradients = self._reduce_gradients  # instance attribute, as add_noise
        elif observer is None and self._reduce_original is not None:
            if opt.__dict__.get("reduce_gradients") == self._reduce_gradients:
                del opt.reduce_gradients
            self._reduce_original, self._awaiting = None, None

    def _noisy_sum(self) -> torch.Tensor:
        """``p.grad`` over ``optimizer.params``, flattened and concatenated into a buffer reused
        from step to step (:class:`FlatGather`: one op; the values and dtype of ``torch.cat``)."""
        return self._noisy.gather([p.grad for p in self.optimizer.params])

    def _reduce_gradients(self) -> None:
        assert self._reduce_original is not None
        self._reduce_original()
        awaiting, self._awaiting = self._awaiting, None
        if awaiting is not None and self.observer is not None:
            rate, factor = awaiting
            total = self._noisy_sum()
            if factor != 1.0:
                total.mul_(factor)
            self.observer(total, rate)

    def joined(self, step: int, rate: float) -> np.ndarray:
        """Indices of the canaries the audit draws into logical step ``step`` at rate ``rate``
        (without ``sampling``)."""
        draws = np.random.default_rng([self.seed, 0xA7, int(step)]).random(self.num_observed)
        return np.flatnonzero(draws < rate)

    def _begin_step(self) -> None:
        """Draw the current logical step's canaries, once (first clipping, else add_noise)."""
        if self._joined is not None:
            return
        try:
            batches = max(1, int(self.optimizer.accumulated_iterations))
        except (AttributeError, TypeError, ValueError):  # no per-example gradients to count
            batches = 1
        self._rate = min(1.0, self.sample_rate * batches)
        self._batches = batches
        if self.sampling is not None:
            self._joined = self.sampling.take(batches, self.steps)
        else:
            self._joined = self.joined(self.steps, self._rate)
        self._placed = not (self.inserts and self._joined.size)

    def _count_batch(self) -> None:
        """Add the physical batch's real examples (the rows of its per-example gradients not
        yet clipped) to the logical step's batch size: shapes only, no device read."""
        params = self.optimizer.params
        parts = _tensors(getattr(params[0], "grad_sample", None)) if params else None
        if parts:
            self._batch_size += sum(int(t.shape[0]) for t in parts if not hasattr(t, "_processed"))
            self._batch_seen = True

    def _clip_and_accumulate(self) -> None:
        assert self._clip_original is not None
        self._begin_step()
        self._count_batch()
        if self._placed or not self.before_clipping:
            self._clip_original()
            return
        layout = self._canary_layout()
        if layout is None:  # Opacus raises its own error, or the step falls back (insertion says why)
            self._clip_original()
            return
        self._clip_original()  # the real examples, as they are: nothing of theirs is copied
        self._placed = True
        if self.flat_rows and _uniform(layout):
            self._clip_canaries_flat(self._joined, layout)
        else:
            self._clip_canaries(self._joined, layout)

    def _canary_layout(self) -> list[tuple[torch.Tensor, torch.device, torch.dtype]] | None:
        """``[(p, device, dtype)]`` of the canary rows for every parameter (those of its
        per-example gradients' last tensor), or None when ``p.grad_sample`` cannot take rows: a
        missing or already clipped one (Opacus' own check then raises), or an unexpected layout
        (the insertion falls back to after clipping)."""
        found = []
        for p in self.optimizer.params:
            gs = getattr(p, "grad_sample", None)
            if gs is None:
                return None
            parts = _tensors(gs)
            if parts is None or parts[-1].dim() != p.dim() + 1 or parts[-1].shape[1:] != p.shape:
                self._fall_back(f"an unexpected p.grad_sample ({type(gs).__name__}) for a parameter of "
                                f"shape {tuple(p.shape)}")
                return None
            if any(hasattr(t, "_processed") for t in parts):
                return None
            found.append((p, parts[-1].device, parts[-1].dtype))
        return found

    def _clip_canaries(self, joined: np.ndarray, layout: list[tuple[torch.Tensor, torch.device, torch.dtype]]
                       ) -> None:
        """Clip ``norm_multiplier * max_grad_norm * scale * c_j`` (j in ``joined``) into
        ``p.summed_grad`` by the optimizer's own ``clip_and_accumulate`` (the one this injector
        wrapped: a class's or an instance's override included), called a second time with
        ``p.grad_sample`` set to the canary rows alone, ``[m, *p.shape]`` each; the real
        per-example gradients (already clipped and summed by the first call, and marked
        processed by it) are put back exactly as they were (the same object, tensor or list),
        so ``accumulated_iterations`` and the label attacks' step hooks see the real examples
        only. Opacus' per-sample norm is over all parameters of a row, so each canary is
        clipped as one example; nothing of the real examples is copied."""
        opt = self.optimizer
        first_device = layout[0][1]
        m = len(joined)
        rows = self._rows(m, first_device)  # (a new buffer clears the cached views)
        views = self._row_views.get(m)
        if views is None:
            if len(self._row_views) >= 64:  # Poisson batches vary m: keep the cache bounded
                self._row_views.clear()
            views = self._row_views[m] = (rows, self._parameter_views(rows, layout))
        rows, blocks = views
        # the indices as the numpy array they are (no Python list, no per-element checks)
        self.canaries.batch(joined, device=first_device, out=rows,
                            scale=self.norm_multiplier * float(opt.max_grad_norm) * self.scale)
        saved = []
        for (p, device, dtype), block in zip(layout, blocks, strict=True):
            saved.append((p, p.grad_sample))
            # a parameter whose per-example gradients are of another dtype or device (mixed
            # precision, a model over devices): the rows converted, as Opacus would see them
            p.grad_sample = block if block.device == device and block.dtype == dtype else block.to(device, dtype)
        try:
            self._clip_original()
        finally:
            for (p, original), block in zip(saved, blocks, strict=True):
                p.grad_sample = original
                # Opacus marks what it clipped as processed (a second use raises): the views are
                # this injector's own, used again at a later step with new rows
                block.__dict__.pop("_processed", None)

    def _rows(self, m: int, device: torch.device) -> torch.Tensor:
        """The first ``m`` rows ``[m, d]`` float32 of the canary-row buffer on ``device``, reused
        from step to step (grown by 8 rows at a time: a fresh m x d allocation costs its page
        faults on the CPU at every step)."""
        buf = self._rows_buffer
        if buf is None or buf.shape[0] < m or buf.device != device:
            buf = self._rows_buffer = torch.empty(-(-m // 8) * 8, self.canaries.dim, dtype=torch.float32,
                                                  device=device)
            self._row_views, self._row_slices = {}, {}
        rows = self._row_slices.get(m)
        if rows is None:  # once per m and buffer (no slice op per step)
            if len(self._row_slices) >= 64:  # Poisson batches vary m: keep the cache bounded
                self._row_slices.clear()
            rows = self._row_slices[m] = buf[:m]
        return rows

    def _clip_canaries_flat(self, joined: np.ndarray,
                            layout: list[tuple[torch.Tensor, torch.device, torch.dtype]]) -> None:
        """Clip ``norm_multiplier * max_grad_norm * scale * c_j`` (j in ``joined``) by the
        optimizer's own ``clip_and_accumulate`` (the one this injector wrapped: a class's or an
        instance's override included), called a second time with the optimizer's parameters
        presented as **one flat parameter** ``[d]`` whose ``grad_sample`` is the canary rows
        ``[m, d]`` and whose ``summed_grad`` is a reused zeroed buffer; the clipped sum is then
        added to every ``p.summed_grad`` by one ``torch._foreach_add_`` over cached views.

        Opacus' per-example norm is over all parameters of a row, so each canary is clipped as
        one example, exactly as in the per-parameter call (:meth:`_clip_canaries`): the norm of
        the row, where that call takes the norm of its per-parameter norms (the same value up
        to float32 rounding, about 1e-7 relative); the summation order of the real and canary
        parts of ``p.summed_grad`` is the same. A clipping bug of the optimizer (a wrong
        ``max_grad_norm``, a wrong clip factor) acts on the canaries as before; the ops do not
        depend on the number of parameter tensors (about 30 top-level aten ops on the CPU,
        Opacus' own call and the rows included, against about ten a tensor for
        :meth:`_clip_canaries`: ``benchmarks/ops_per_step.py``).

        The flat parameter is shown through ``param_groups`` (Opacus' ``params``) for the
        duration of the call only, with the first group's other settings; the real parameter
        groups are put back, unchanged, in a ``finally``."""
        opt = self.optimizer
        device, dtype = layout[0][1], layout[0][2]
        params = [p for p, _, _ in layout]
        flat = self._flat
        if flat is None or not flat.fits(params, dtype):
            flat = self._flat = _FlatCanaryParameter(params, dtype)
        rows = self._rows(len(joined), device)
        self.canaries.batch(joined, device=device, out=rows,
                            scale=self.norm_multiplier * float(opt.max_grad_norm) * self.scale)
        grad_sample = rows if rows.dtype == dtype else rows.to(dtype)
        groups = opt.original_optimizer.param_groups
        flat.summed.zero_()
        flat.param.summed_grad = flat.summed
        flat.param.grad_sample = grad_sample
        opt.original_optimizer.param_groups = [{**groups[0], "params": [flat.param]}]
        try:
            self._clip_original()
        finally:
            opt.original_optimizer.param_groups = groups
            flat.param.grad_sample = None
            # Opacus marks what it clipped as processed (a second use raises): the rows are
            # this injector's own, refilled at a later step
            grad_sample.__dict__.pop("_processed", None)
        if flat.param.summed_grad is not flat.summed:  # an override that replaced it
            flat.summed.copy_(flat.param.summed_grad.reshape(-1))
        flat.param.summed_grad = None
        torch._foreach_add_([p.summed_grad for p in params], flat.views)  # one op, not one a parameter

    @staticmethod
    def _parameter_views(rows: torch.Tensor, layout: list[tuple[torch.Tensor, torch.device, torch.dtype]]
                         ) -> list[torch.Tensor]:
        """Each parameter's columns of ``rows`` ``[m, d]`` (contiguous) as ``[m, *p.shape]``
        views: the columns of one parameter are contiguous within each row, so the view always
        exists, and refilling ``rows`` refills them."""
        m, out, offset = rows.shape[0], [], 0
        for p, _, _ in layout:
            n = p.numel()
            out.append(rows[:, offset:offset + n].view(m, *p.shape))
            offset += n
        return out

    def _fall_back(self, reason: str) -> None:
        """From now on insert after clipping (``insertion`` says why)."""
        self.before_clipping = False
        self.insertion = f"after clipping: {reason}"

    def _add_noise(self) -> None:
        opt = self.optimizer
        self._begin_step()
        idx, rate = self._joined, self._rate
        assert idx is not None
        if not self._placed:  # after clipping: into the clipped sum
            if self.before_clipping:  # clip_and_accumulate never ran for this step
                self._fall_back("the optimizer took a step without calling clip_and_accumulate")
            if idx.size:  # (with no canary in this step nothing is added: not even zeros)
                summed = [p.summed_grad for p in opt.params]
                total = self.canaries.sum(idx, device=summed[0].device).mul_(float(opt.max_grad_norm) * self.scale)
                parts = [part.view_as(g) if part.dtype == g.dtype else part.view_as(g).to(g.dtype)
                         for part, g in zip(total.split([g.numel() for g in summed]), summed, strict=True)]
                torch._foreach_add_(summed, parts)  # one op, not one a parameter
        if idx.size:
            np.add.at(self.participations, idx, 1)
        self.steps += 1
        # the step's real batch size, where clip_and_accumulate counted it (None: unknown)
        self.last_batch_size = self._batch_size if self._batch_seen else None
        self.last_batches = self._batches
        self.batches_total += self._batches
        self._batch_size, self._batch_seen = 0, False
        self._joined, self._placed = None, False
        if self.observer is not None and self._reduce_original is not None:
            # data-parallel: observed after Opacus' all-reduce, multiplied back to the sum
            factor = 1.0
            if opt.loss_reduction == "mean":
                factor = float(opt.expected_batch_size * opt.accumulated_iterations * self.world_size)
            self._awaiting = (rate, factor)
        self._original()
        if self.observer is not None and self._reduce_original is None:
            self.observer(self._noisy_sum(), rate)  # one process: p.grad is the whole noisy sum

    def detach(self) -> None:
        """Restore the optimizer's own ``add_noise`` and ``clip_and_accumulate`` (the loader's
        sampler is the owner's of ``sampling`` to restore)."""
        opt = self.optimizer
        for name, mine in (("add_noise", self._add_noise), ("clip_and_accumulate", self._clip_and_accumulate)):
            if opt.__dict__.get(name) == mine:  # else someone wrapped it since: leave theirs
                if self._own[name] is None:
                    del opt.__dict__[name]
                else:
                    opt.__dict__[name] = self._own[name]
        self._joined, self._placed, self._rows_buffer, self._row_views = None, False, None, {}
        self._row_slices, self._flat = {}, None
        self._noisy = FlatGather()
        self.set_observer(None)
