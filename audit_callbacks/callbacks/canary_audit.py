"""``CanaryAudit``: one-shot empirical epsilon for DP-FedAvg or Opacus DP-SGD, in the run itself.

Paper 003 (Andrew et al., ICLR 2024), Alg. 2 (final model) and Alg. 3 (all iterates); METHODS
A4-A7. The callback detects which training it is attached to:

* DP-FedAvg (:class:`~audit_callbacks.federated.DPFedAvg`): random canary clients join the
  population and are sampled like real clients; each returns ``clip_norm * c_j`` when sampled.
* Opacus DP-SGD (a ``DPOptimizer`` returned by ``configure_optimizers``, e.g. from
  ``PrivacyEngine.make_private``): example-level gradient canaries (METHODS A7) join every
  logical step with the sampling rate of a real example and add ``max_grad_norm * c_j`` to the
  sum of clipped gradients before the noise. The model moves against gradients, so the
  statistics are ``cos(c_j, theta_0 - theta_t)`` and ``max_t cos(c_j, theta_{t-1} - theta_t)``.
  The analytic epsilon is the run's own Opacus accountant's (RDP and PRV are logged beside it).

It logs, at every validation epoch end and at fit end:

* ``audit/epsilon_final_model`` - epsilon from the cosines ``cos(c_j, theta_t - theta_0)`` of the
  canaries that took part so far, against the exact null of a random direction (A1, A4);
* ``audit/epsilon_all_iterates`` - from ``max_t cos(c_j, theta_t - theta_{t-1})``, observed against
  unobserved canaries (A5);
* ``audit/epsilon_lo_final_model``, ``audit/epsilon_lo_all_iterates`` - the 1 - alpha lower
  bounds of A6 with the threshold chosen on a held-out half of the canaries (a valid 95% bound);
* ``audit/epsilon_lo_max_final_model``, ``audit/epsilon_lo_max_all_iterates`` - the paper's A6
  bound, maximised over thresholds on all canaries. It is tighter but NOT a valid 95% bound when
  the true epsilon is small (measured: exceeds the true epsilon in 33% of runs at epsilon 0.1,
  7-10% at epsilon 1; tests/test_estimators_lower_bound.py), so it is logged beside, not instead;
* ``audit/epsilon_analytic`` - DP-FedAvg: the Gaussian mechanism if the adversary knows the
  rounds (METHODS D), for the largest participation count of a canary; DP-SGD: the run's
  accountant, with ``audit/epsilon_analytic_rdp`` and ``audit/epsilon_analytic_prv`` beside it;
* ``audit/num_canaries`` - observed canaries that took part.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from audit_callbacks.callbacks import tensorboard as tb
from audit_callbacks.callbacks.summary import write_summary
from audit_callbacks.canaries import CanarySet
from audit_callbacks.canary_stats import CanaryStatistics
from audit_callbacks.dpsgd import (
    GradientCanaryInjector,
    accountant_epsilon,
    analytic_epsilons,
    find_accountant,
    find_dp_optimizer,
    flat_parameters,
)
from audit_callbacks.estimators.canary_report import canary_report, cosine_null_pdf
from audit_callbacks.federated.clipping import clipped_sum

__all__ = ["CanaryAudit"]

_DEFAULT_CANARIES = 1000
_BUFFER_BYTES = 16 << 20  # model deltas buffered between passes over the canaries (default)
_PREFETCH_BYTES = 4 << 20  # canary updates generated ahead of use, at most (see _prefetch)
_CROWDING_SHARE = 0.1  # canaries' share of the population from which a warning says what it costs

TAGS = {
    "final": "audit/epsilon_final_model",
    "final_lo": "audit/epsilon_lo_final_model",
    "final_lo_max": "audit/epsilon_lo_max_final_model",
    "all": "audit/epsilon_all_iterates",
    "all_lo": "audit/epsilon_lo_all_iterates",
    "all_lo_max": "audit/epsilon_lo_max_all_iterates",
    "analytic": "audit/epsilon_analytic",
    "analytic_rdp": "audit/epsilon_analytic_rdp",
    "analytic_prv": "audit/epsilon_analytic_prv",
    "n": "audit/num_canaries",
}


_UNRESOLVED = object()


class _Batch:
    """Canary updates generated ahead: ``indices`` (cohort order), the Future of their rows
    ``[len(indices), d]`` (or of ``(rows, clipped sum [d])`` for a batch that is a whole round's
    canaries), and once used the rows and the clipped sum (None until computed)."""

    __slots__ = ("future", "indices", "rows", "total")

    def __init__(self, indices: list[int], future: Any) -> None:
        self.indices = indices
        self.future = future
        self.rows: Any = _UNRESOLVED
        self.total: torch.Tensor | None = None


class CanaryAudit(Callback):
    """Insert canaries into DP-FedAvg or Opacus DP-SGD and estimate epsilon from their cosines.

    Attach it to a ``Trainer`` that fits a :class:`~audit_callbacks.federated.DPFedAvg`, or a
    LightningModule whose ``configure_optimizers`` returns an Opacus ``DPOptimizer``.

    Args:
        num_canaries: k observed canaries (clients, or gradient canaries in DP-SGD). Default:
            1000, capped at the number of real clients (DP-FedAvg) or training examples (DP-SGD).
            DP-FedAvg: sampled canaries take about k / (N + k) of every cohort's places from the
            N real clients; a warning says so (once) when that share is 10% or more, with the
            ``clients_per_round`` that keeps the real clients a round.
        num_unobserved: k' canaries never inserted, the empirical null of the all-iterates test
            (default: equal to k; 0 disables the all-iterates estimate).
        repeats: if set, canaries are not sampled: each is presented ``repeats`` times, once in a
            uniformly chosen round of each of ``repeats`` equal periods of training, on top of
            the sampled cohort (paper 003 §5.2). Needs ``max_steps`` or a finite epoch count.
            DP-FedAvg only.
        delta: the delta of every epsilon (default: the module's ``delta``).
        alpha: 1 - confidence of the lower bounds (A6).
        bootstrap: bootstrap resamples for the estimates' percentile intervals, computed at fit
            end for the summary JSON (0: none).
        seed: the canaries' seed; canary j is regenerated from (seed, j).
        every_n_epochs: estimate and log every n validation epochs (always at fit end).
        max_buffered_rounds: model deltas kept before a pass over the canaries (memory
            ``max_buffered_rounds * d`` floats, twice that while a background pass holds the
            previous ones, plus up to two partly filled blocks of at most 8 MiB: see
            :mod:`audit_callbacks.canary_stats`); default: as many as fit in 16 MiB, at least 1.
            The estimates do not depend on it.
        background: estimate on a background thread while training goes on (default). The
            canaries are regenerated for every estimate, and that pass would otherwise stall
            training: with ``background=True`` the estimate of a validation epoch is computed
            while the next rounds train and logged at that validation's step as soon as it is
            ready (at the latest at the next validation, a checkpoint, or fit end, which wait
            for it). The last validation of a fit, and ``trainer.validate``, estimate at once,
            as does the pass a full buffer of deltas starts (a background one would hold a
            second buffer). The values are the same either way.
        log_histograms, log_figures: TensorBoard extras (need a ``TensorBoardLogger``).
        summary_filename: the JSON written at fit end in the logger's directory.
        sample_rate: DP-SGD only: the Poisson rate at which a canary joins a step. Default: the
            rate the Opacus accountant is charged (read from its step hook), else
            ``1 / len(train_dataloader)`` as ``make_private`` computes it.

    Raises:
        TypeError: neither a DP-FedAvg module (no ``register_virtual_clients``) nor an Opacus
            ``DPOptimizer`` among the trainer's optimizers (raised at fit start).
        ValueError: bad arguments, a model with fewer than 2 parameters, no canaries,
            ``repeats`` with DP-SGD.
    """

    def __init__(
        self,
        num_canaries: int | None = None,
        num_unobserved: int | None = None,
        *,
        repeats: int | None = None,
        delta: float | None = None,
        alpha: float = 0.05,
        bootstrap: int = 200,
        seed: int = 0,
        every_n_epochs: int = 1,
        max_buffered_rounds: int | None = None,
        log_histograms: bool = True,
        log_figures: bool = True,
        summary_filename: str = "audit_summary.json",
        sample_rate: float | None = None,
        background: bool = True,
    ) -> None:
        if num_canaries is not None and num_canaries < 1:
            raise ValueError(f"num_canaries must be >= 1 (there is nothing to audit), got {num_canaries}")
        if num_unobserved is not None and num_unobserved < 0:
            raise ValueError(f"num_unobserved must be >= 0, got {num_unobserved}")
        if repeats is not None and repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if bootstrap < 0:
            raise ValueError(f"bootstrap must be >= 0, got {bootstrap}")
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if sample_rate is not None and not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.requested_canaries = num_canaries
        self.requested_unobserved = num_unobserved
        self.repeats = repeats
        self.delta = delta
        self.alpha = float(alpha)
        self.bootstrap = int(bootstrap)
        self.seed = int(seed)
        self.every_n_epochs = int(every_n_epochs)
        self.max_buffered_rounds = max_buffered_rounds
        self.log_histograms = log_histograms
        self.log_figures = log_figures
        self.summary_filename = summary_filename
        self.sample_rate = sample_rate
        self.background = bool(background)
        self.mode: str | None = None  # "fedavg" or "dpsgd", known at setup / fit start
        self.injector: GradientCanaryInjector | None = None
        self._accountant: Any = None
        self._theta_prev: torch.Tensor | None = None
        self._steps_seen = 0
        self._pending_state: dict[str, Any] | None = None

        self.num_canaries = 0
        self.num_unobserved = 0
        self.stats: CanaryStatistics | None = None
        self.participations: np.ndarray = np.zeros(0, dtype=np.int64)
        self._schedule: dict[int, list[int]] | None = None
        self._restored = False
        self._layout_written = False
        self.last_report: dict[str, Any] | None = None
        self._last_logged_round = -1
        self._warned: set[str] = set()
        self._trainer_ref: pl.Trainer | None = None
        self._prefetched: dict[int, tuple[_Batch, int]] = {}  # canary index -> (batch, row)
        self._prefetch_queue: list[list[int]] = []
        self._prefetch_scale = 1.0
        self._prefetch_whole = False  # the round's canaries are one batch
        self._jobs: list[tuple[Any, int, int]] = []  # (Future of a report, step, progress)

    # ------------------------------------------------------------------ set-up
    @property
    def state_key(self) -> str:
        return self._generate_state_key(seed=self.seed, num_canaries=self.requested_canaries)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message, category=UserWarning)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not callable(getattr(pl_module, "register_virtual_clients", None)):
            # Opacus DP-SGD: the DPOptimizer exists only after configure_optimizers, which
            # Lightning calls after setup; on_fit_start finds it (or raises TypeError).
            if self.repeats is not None:
                raise ValueError("CanaryAudit(repeats=...) is for DP-FedAvg; DP-SGD canaries are sampled")
            self.mode = "dpsgd"
            return
        self.mode = "fedavg"
        dim = int(pl_module.num_parameters)
        if dim < 2:
            raise ValueError(f"the model has {dim} trainable parameter(s); canaries need d >= 2")
        n_real = int(pl_module.num_real_clients)
        if self.requested_canaries is None:
            k = min(_DEFAULT_CANARIES, n_real)
        else:
            k = int(self.requested_canaries)
        if self.repeats is None:
            self._warn_crowding(k, n_real, getattr(pl_module, "clients_per_round", None))
        k_un = k if self.requested_unobserved is None else int(self.requested_unobserved)
        self.num_canaries, self.num_unobserved = k, k_un
        if self.max_buffered_rounds is None:
            buffered = max(1, _BUFFER_BYTES // (4 * dim))
        else:
            buffered = max(1, int(self.max_buffered_rounds))
        canaries = CanarySet(self.seed, dim, k + k_un)
        if self.stats is None or self.stats.dim != dim:
            self.stats = CanaryStatistics(canaries, k, k_un, sign=1.0, max_buffered=buffered,
                                          background=False)
            self.participations = np.zeros(k, dtype=np.int64)
        if self.repeats is None:
            pl_module.register_virtual_clients(self, k, name="canary")
        else:
            pl_module.register_virtual_clients(self, k, name="canary", schedule=self._scheduled)

    def _warn_crowding(self, k: int, n_real: int, per_round: int | None) -> None:
        """Sampled canary clients take cohort places from real clients (paper 003 Alg. 2): say so
        once when they are at least ``_CROWDING_SHARE`` of the population, with the cohort size
        that keeps the real clients a round."""
        if n_real <= 0 or k <= 0:
            return
        share = k / (n_real + k)
        if share < _CROWDING_SHARE:
            return
        hint = ""
        if per_round:
            keep = math.ceil(per_round * (n_real + k) / n_real)
            hint = f"; to keep {per_round} real clients a round on average, set clients_per_round={keep}"
        what = "outnumber" if k > n_real else "are a large share of the population next to"
        self._warn_once(
            "many", f"CanaryAudit: {k} canary clients {what} the {n_real} real clients, so about "
            f"{share:.0%} of every cohort are canaries in places real clients would take, which "
            f"slows learning{hint}, or pass a smaller num_canaries",
        )

    def _scheduled(self, round_idx: int) -> list[int]:
        if self._schedule is None:
            total = _total_rounds(self._trainer_ref)
            rng = np.random.default_rng([self.seed, 0x5C4ED])
            bounds = np.linspace(0, total, self.repeats + 1).astype(int)
            schedule: dict[int, list[int]] = {}
            for p in range(self.repeats):
                lo, hi = int(bounds[p]), max(int(bounds[p + 1]), int(bounds[p]) + 1)
                rounds = rng.integers(lo, hi, size=self.num_canaries) + 1
                for j, r in enumerate(rounds.tolist()):
                    schedule.setdefault(r, []).append(j)
            self._schedule = schedule
        return self._schedule.get(round_idx, [])

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer_ref = trainer
        if self.mode == "dpsgd":
            self._setup_dpsgd(trainer, pl_module)
        assert self.stats is not None
        if self.stats.theta0 is None:
            self.stats.set_initial(self._flat(pl_module))
        if not self._layout_written:
            analytic = [TAGS["analytic"]]
            if self.mode == "dpsgd":
                analytic += [TAGS["analytic_rdp"], TAGS["analytic_prv"]]
            tb.add_custom_scalars_layout(trainer, {
                "privacy audit": {
                    "epsilon (final model)": ["Multiline", [TAGS["final"], TAGS["final_lo"], *analytic]],
                    "epsilon (all iterates)": ["Multiline", [TAGS["all"], TAGS["all_lo"], *analytic]],
                    # DPFedAvg logs val/accuracy; a user's DP-SGD module may log any val*acc* tag
                    # (custom-scalars tags are regular expressions)
                    "accuracy": ["Multiline", ["val/accuracy" if self.mode == "fedavg" else r"val.*acc.*"]],
                },
            })
            self._layout_written = True

    def _flat(self, pl_module: pl.LightningModule) -> torch.Tensor:
        if self.mode == "dpsgd":
            assert self.injector is not None
            return flat_parameters(self.injector.optimizer.params)
        return pl_module.flat_parameters()

    def _setup_dpsgd(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Find the DPOptimizer, its accountant and rate; wrap its add_noise (METHODS A7)."""
        opt = find_dp_optimizer(trainer.optimizers)
        if opt is None:
            raise TypeError(
                "CanaryAudit audits DP-FedAvg (audit_callbacks.federated.DPFedAvg) or Opacus DP-SGD, "
                f"but {type(pl_module).__name__} is neither: return the optimizer of "
                "PrivacyEngine().make_private(...) from configure_optimizers"
            )
        if self.injector is not None:
            self.injector.detach()
        self._accountant, rate = find_accountant(opt)
        if self.sample_rate is not None:
            rate = self.sample_rate
        n_examples = _num_examples(trainer)
        if rate is None:
            loader_len = _num_batches(trainer)
            if loader_len is None:
                raise ValueError(
                    "CanaryAudit: cannot tell the DP-SGD sampling rate (no Opacus accountant hook "
                    "and no sized train dataloader); pass CanaryAudit(sample_rate=...)"
                )
            rate = 1.0 / loader_len
            self._warn_once("rate", f"CanaryAudit: no Opacus accountant found on the optimizer's step hook; "
                            f"canaries join with rate 1/len(train_dataloader) = {rate:.4g}")
        if self._accountant is None:
            self._warn_once("acc", "CanaryAudit: no Opacus accountant found on the optimizer's step hook; "
                            "the analytic epsilon is computed from the steps this callback counts")
        params = opt.params
        dim = int(sum(p.numel() for p in params))
        if dim < 2:
            raise ValueError(f"the model has {dim} trainable parameter(s); canaries need d >= 2")
        if self.requested_canaries is None:
            k = min(_DEFAULT_CANARIES, n_examples) if n_examples else _DEFAULT_CANARIES
        else:
            k = int(self.requested_canaries)
        k_un = k if self.requested_unobserved is None else int(self.requested_unobserved)
        self.num_canaries, self.num_unobserved = k, k_un
        buffered = max(1, _BUFFER_BYTES // (4 * dim)) if self.max_buffered_rounds is None else max(1, int(self.max_buffered_rounds))
        canaries = CanarySet(self.seed, dim, k + k_un)
        self.stats = CanaryStatistics(canaries, k, k_un, sign=-1.0, max_buffered=buffered,
                                      background=False)
        self.injector = GradientCanaryInjector(opt, canaries, k, rate, seed=self.seed)
        self.participations = self.injector.participations
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._load(state)
        self._theta_prev = self._flat(pl_module)
        self._steps_seen = self.injector.steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """DP-SGD: after a logical step, fold the parameter delta into the all-steps maxima."""
        if self.mode != "dpsgd" or self.injector is None or self.stats is None:
            return
        if self._jobs:
            self._drain(trainer, wait=False)
        steps = self.injector.steps
        if steps == self._steps_seen:
            return  # gradient accumulation / BatchMemoryManager: no step was taken
        theta = self._flat(pl_module)
        if not self.stats.add_delta(theta - self._theta_prev):
            self._warn_once("nan", f"CanaryAudit: step {steps} produced a parameter delta with NaN or inf; "
                            "that step is skipped by the all-iterates statistic")
        self._theta_prev = theta
        self._steps_seen = steps

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.injector is not None:
            self.injector.detach()
        self._drop_prefetched()
        if self.stats is not None:
            try:
                self._drain(trainer, wait=True)  # a fit that stopped early: log what is pending
            finally:
                self.stats.close()  # the estimation and generating threads end with the fit
                self.stats.canaries.close()

    # ------------------------------------------------------------------ protocol
    def federated_client_updates(
        self, trainer: pl.Trainer, pl_module: Any, indices: np.ndarray, round_idx: int,
        clip_norm: float, out: torch.Tensor,
    ) -> None:
        """Canary clients ``indices`` write ``clip_norm * c_j`` into the rows ``out`` ``[m, d]``
        (paper 003 Alg. 2): the batches generated ahead are copied whole; a canary not generated
        ahead (or of a batch cancelled behind an estimate) is generated here. The rows are the
        same bits either way."""
        assert self.stats is not None
        idx = [int(j) for j in indices]
        pos = 0
        while pos < len(idx):
            entry = self._prefetched.get(idx[pos]) if clip_norm == self._prefetch_scale else None
            if entry is not None:
                batch, row = entry
                run = batch.indices[row:]
                if idx[pos:pos + len(run)] == run:
                    rows = self._resolve(batch)
                    for j in run:
                        self._prefetched.pop(j, None)
                    out[pos:pos + len(run)].copy_(rows[row:])
                    pos += len(run)
                    continue
            out[pos].copy_(self.federated_client_update(trainer, pl_module, idx[pos], round_idx, clip_norm))
            pos += 1

    def federated_client_update_sum(
        self, trainer: pl.Trainer, pl_module: Any, indices: np.ndarray, round_idx: int,
        clip_norm: float,
    ) -> torch.Tensor:
        """The sum ``[d]`` of the clipped updates ``clip_norm * c_j`` of canary clients
        ``indices`` (paper 003 Alg. 2), each clipped by
        :func:`~audit_callbacks.federated.clipping.clip_updates_` as the module clips its rows.

        When the round's canaries were generated ahead as one batch (a float32 model on the
        CPU), the background thread has clipped and summed them too and this returns that sum;
        otherwise the rows are built here (:meth:`federated_client_updates`) in the module's
        device and dtype (those of its trainable parameters), clipped and summed. The bits are
        the same either way, and the same as the module's sum of the rows it clips itself.

        Raises:
            IndexError: an index outside ``[0, num_canaries)``.
        """
        assert self.stats is not None
        idx = [int(j) for j in indices]
        entry = self._prefetched.get(idx[0]) if idx and clip_norm == self._prefetch_scale else None
        device, dtype = _update_device_dtype(pl_module)
        native = device.type == "cpu" and dtype == torch.float32
        if native and entry is not None and entry[1] == 0 and entry[0].indices == idx:
            batch = entry[0]
            rows = self._resolve(batch)
            for j in idx:
                self._prefetched.pop(j, None)
            if batch.total is not None:
                return batch.total
            return clipped_sum(rows, clip_norm)  # generated here (cancelled behind an estimate)
        rows = torch.empty(len(idx), self.stats.dim, device=device, dtype=dtype)
        self.federated_client_updates(trainer, pl_module, indices, round_idx, clip_norm, rows)
        return clipped_sum(rows, clip_norm)

    def federated_client_update(
        self, trainer: pl.Trainer, pl_module: Any, index: int, round_idx: int, clip_norm: float,
    ) -> torch.Tensor:
        """Canary client ``index`` returns ``clip_norm * c_index`` (paper 003 Alg. 2)."""
        assert self.stats is not None
        entry = self._prefetched.pop(index, None)
        if entry is not None and clip_norm == self._prefetch_scale:
            batch, row = entry
            return self._resolve(batch)[row].to(device=pl_module.device)
        return self.stats.canaries.canary(index, device=pl_module.device, scale=clip_norm)

    def _resolve(self, batch: _Batch) -> torch.Tensor:
        """A prefetched batch's rows. One that has not started (the background thread is busy
        with an estimate) is cancelled and generated here instead. The first use of a batch
        submits the next one, keeping the thread one batch ahead."""
        if batch.rows is _UNRESOLVED:
            self._prefetch_next()
            if batch.future.cancel():  # generated here, the same bits
                assert self.stats is not None
                batch.rows = self.stats.canaries.batch(batch.indices, scale=self._prefetch_scale)
            else:
                result = batch.future.result()
                batch.rows, batch.total = result if isinstance(result, tuple) else (result, None)
        return batch.rows

    def _drop_prefetched(self) -> None:
        """Forget this round's canaries generated ahead; cancel the batches not yet used, so
        that they do not hold the background thread (a fit stopped mid-round, a clip norm that
        changed)."""
        for batch, _ in self._prefetched.values():
            if batch.rows is _UNRESOLVED:
                batch.future.cancel()
        self._prefetched.clear()
        self._prefetch_queue.clear()

    def on_federated_round_start(self, trainer, pl_module, round_idx, cohort) -> None:
        idx = cohort.virtual.get("canary")
        self._drop_prefetched()
        if idx is not None and idx.size:
            np.add.at(self.participations, idx, 1)
            self._prefetch(idx.tolist(), float(getattr(pl_module, "clip_norm", 1.0)))

    def _prefetch(self, indices: list[int], clip_norm: float) -> None:
        """Generate this round's canary updates in a background thread while the real clients
        train (real clients come first in a round): batches of at most ``_PREFETCH_BYTES``, one
        in flight ahead of the batch in use (a whole cohort's canaries are one batch up to
        d ~ 35,000 with 30 canaries a round)."""
        assert self.stats is not None
        canaries = self.stats.canaries
        if canaries.workers < 2:
            return
        per = max(1, _PREFETCH_BYTES // (4 * canaries.dim))
        self._prefetch_scale = clip_norm
        self._prefetch_queue = [indices[i:i + per] for i in range(0, len(indices), per)][::-1]
        self._prefetch_whole = len(indices) <= per
        self._prefetch_next()

    def _prefetch_next(self) -> None:
        if not self._prefetch_queue:
            return
        assert self.stats is not None
        indices = self._prefetch_queue.pop()  # popped from the end: in cohort order
        canaries, scale = self.stats.canaries, self._prefetch_scale
        if self._prefetch_whole:  # the whole round's canaries: their clipped sum is made there too
            pool = canaries.executor()
            assert pool is not None
            future = pool.submit(_rows_and_clipped_sum, canaries, indices, scale)
        else:
            future = canaries.submit_many(indices, scale=scale)
        batch = _Batch(indices, future)
        for row, j in enumerate(indices):
            self._prefetched[j] = (batch, row)

    def on_federated_round_end(self, trainer, pl_module, round_idx, model_delta) -> None:
        assert self.stats is not None
        self._drop_prefetched()
        if self._jobs:
            self._drain(trainer, wait=False)
        if not self.stats.add_delta(model_delta):
            self._warn_once(
                "nan", f"CanaryAudit: round {round_idx} produced a model delta with NaN or inf; "
                "that round is skipped by the all-iterates statistic",
            )

    # ------------------------------------------------------------------ estimates
    def compute(self, pl_module: pl.LightningModule, *, bootstrap: int = 0) -> dict[str, Any] | None:
        """Flush the statistics and compute every estimate; None until 2 canaries took part.

        Waits for (and logs) the background estimates still in flight first.

        Returns a dict with ``estimates`` (name -> :class:`Estimate`, see
        :func:`~audit_callbacks.estimators.canary_report.canary_report`), ``skipped``,
        ``analytic_epsilon``, ``max_participations``, ``num_canaries_participated`` and the raw
        ``statistics``.
        """
        assert self.stats is not None
        self._drain(self._trainer_ref, wait=True)
        inputs = self._report_inputs(pl_module)
        if inputs is None:
            return None
        stats = self.stats.compute(inputs.pop("theta"))
        report = self._report(stats, inputs, bootstrap)
        self.last_report = report
        return report

    def _report_inputs(self, pl_module: pl.LightningModule) -> dict[str, Any] | None:
        """What an estimate needs from the training thread (model, participations, analytic
        epsilon), or None (with a warning) when there is nothing to estimate."""
        assert self.stats is not None
        theta = self._flat(pl_module)
        if not bool(torch.isfinite(theta).all()):
            self._warn_once("theta", "CanaryAudit: the model has NaN or inf parameters; no estimate")
            return None
        took_part = self.participations > 0  # a copy: the run goes on
        if int(took_part.sum()) < 2:
            self._warn_once("few", "CanaryAudit: fewer than 2 canaries have taken part; no estimate yet")
            return None
        delta = self._delta(pl_module)
        max_part = int(self.participations.max(initial=0))
        inputs: dict[str, Any] = {"theta": theta, "took_part": took_part, "delta": delta,
                                  "max_participations": max_part, "analytic_epsilon": None}
        if self.mode == "dpsgd":
            inputs["analytic_epsilons"] = self._dpsgd_analytic(delta)
            inputs["analytic_epsilon"] = inputs["analytic_epsilons"]["accountant"]
        elif hasattr(pl_module, "analytic_epsilon"):
            inputs["analytic_epsilon"] = pl_module.analytic_epsilon(max_part)
        return inputs

    def _report(self, statistics: dict[str, torch.Tensor], inputs: dict[str, Any], bootstrap: int) -> dict[str, Any]:
        """Every estimate from the statistics (numpy and scipy only: runs on any thread)."""
        assert self.stats is not None
        stats = {k: v.numpy() for k, v in statistics.items()}
        took_part = inputs["took_part"]
        report = canary_report(
            stats["final_observed"][took_part],
            inputs["delta"],
            dim=self.stats.dim,
            observed_all=stats["all_observed"][took_part] if stats["all_observed"].size else None,
            unobserved_all=stats["all_unobserved"] if self.num_unobserved >= 2 else None,
            alpha=self.alpha,
            bootstrap=bootstrap,
            seed=self.seed,
        )
        if "analytic_epsilons" in inputs:
            report["analytic_epsilons"] = inputs["analytic_epsilons"]
        report["analytic_epsilon"] = inputs["analytic_epsilon"]
        report["max_participations"] = inputs["max_participations"]
        report["num_canaries_participated"] = int(took_part.sum())
        report["statistics"] = stats
        report["took_part"] = took_part
        return report

    def _submit_estimate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start this validation's estimate on the estimation thread (see ``background``)."""
        assert self.stats is not None
        inputs = self._report_inputs(pl_module)
        if inputs is None:
            return
        step = int(trainer.global_step)
        bins = tb.histogram_bins(trainer) if self.log_histograms else None

        def then(statistics: dict[str, torch.Tensor]) -> dict[str, Any]:
            report = self._report(statistics, inputs, 0)
            if bins is not None:  # built here too: the training thread only writes them
                report["histogram_summaries"] = self._histogram_summaries(report, step, bins)
                report["histogram_step"] = step
            return report

        future = self.stats.compute_async(inputs.pop("theta"), then=then)
        self._jobs.append((future, step, self._progress(trainer, pl_module)))

    def _drain(self, trainer: pl.Trainer | None, *, wait: bool) -> None:
        """Log the background estimates that are ready (all of them with ``wait``), in order."""
        while self._jobs:
            future, step, progress = self._jobs[0]
            if not wait and not future.done():
                return
            self._jobs.pop(0)
            report = future.result()  # re-raises what went wrong on the estimation thread
            self.last_report = report
            if trainer is not None:
                self._log_report(trainer, report, step, progress, at_fit_end=False)

    def _delta(self, pl_module: pl.LightningModule) -> float:
        if self.delta is not None:
            return self.delta
        own = getattr(pl_module, "delta", None)
        if own is not None:
            return float(own)
        return 1e-5 if self.mode == "dpsgd" else 1e-6  # Opacus examples' delta; DPFedAvg's default

    def _dpsgd_analytic(self, delta: float) -> dict[str, float | None]:
        """The run's accountant's epsilon, and Opacus RDP and PRV from the same history."""
        assert self.injector is not None
        acc = self._accountant
        history = list(getattr(acc, "history", None) or [])
        if not history and self.injector.steps:
            opt = self.injector.optimizer
            history = [(float(opt.noise_multiplier), self.injector.sample_rate, self.injector.steps)]
        out = analytic_epsilons(history, delta)
        own = accountant_epsilon(acc, delta) if history else None
        if own is None:
            own = out["rdp"]
        return {"accountant": own, "mechanism": getattr(acc, "mechanism", lambda: None)() if acc else None, **out}

    def _metrics(self, report: dict[str, Any]) -> dict[str, float | None]:
        est = report["estimates"]

        def val(name: str) -> float | None:
            e = est.get(name)
            return None if e is None else e.value

        return {
            TAGS["final"]: val("final_model"),
            TAGS["final_lo"]: val("final_model_lower_bound_heldout"),
            TAGS["final_lo_max"]: val("final_model_lower_bound"),
            TAGS["all"]: val("all_iterates"),
            TAGS["all_lo"]: val("all_iterates_lower_bound_heldout"),
            TAGS["all_lo_max"]: val("all_iterates_lower_bound"),
            TAGS["analytic"]: report["analytic_epsilon"],
            TAGS["n"]: float(report["num_canaries_participated"]),
            **({TAGS["analytic_rdp"]: report["analytic_epsilons"]["rdp"],
                TAGS["analytic_prv"]: report["analytic_epsilons"]["prv"]} if "analytic_epsilons" in report else {}),
        }

    def _histogram_summaries(self, report: dict[str, Any], step: int, bins: list[float] | None) -> list[Any]:
        """Histograms of observed, unobserved and null cosines (numpy only: any thread)."""
        assert self.stats is not None
        if bins is None:  # no TensorBoard logger
            return []
        stats, took = report["statistics"], report["took_part"]
        half = (self.stats.dim - 1) / 2
        null = np.random.default_rng([self.seed, step]).beta(half, half, size=4096) * 2 - 1
        return tb.histogram_summaries({
            "audit/cosine_final_observed": stats["final_observed"][took],
            "audit/cosine_final_null": null,
            "audit/cosine_all_observed": stats["all_observed"][took] if stats["all_observed"].size else np.empty(0),
            "audit/cosine_all_unobserved": stats["all_unobserved"],
        }, bins)

    def _log_extras(
        self, trainer: pl.Trainer, report: dict[str, Any], step: int, figure: bool, histograms: bool = True,
    ) -> None:
        stats, took = report["statistics"], report["took_part"]
        dim = self.stats.dim
        if self.log_histograms and histograms:
            summaries = report.pop("histogram_summaries", None)  # built by a background estimate
            if summaries is None or report.pop("histogram_step", None) != step:
                summaries = self._histogram_summaries(report, step, tb.histogram_bins(trainer))
            tb.add_summaries(trainer, summaries, step)
        if self.log_figures and figure:
            sd = 1 / math.sqrt(dim)
            grid = np.linspace(-5 * sd, 5 * sd, 200)
            tb.add_density_figure(
                trainer, "audit/cosine_density_final_model",
                {"observed canaries": stats["final_observed"][took], "unobserved canaries": stats["final_unobserved"]},
                step, title="final model: canary cosines", null_pdf=(grid, cosine_null_pdf(grid, dim)),
            )
            if stats["all_observed"].size:
                tb.add_density_figure(
                    trainer, "audit/cosine_density_all_iterates",
                    {"observed (max over rounds)": stats["all_observed"][took],
                     "unobserved (max over rounds)": stats["all_unobserved"]},
                    step, title="all iterates: max cosine over rounds",
                )

    def _estimate_and_log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, at_fit_end: bool) -> None:
        report = self.compute(pl_module, bootstrap=self.bootstrap if at_fit_end else 0)
        if report is not None:
            step, progress = int(trainer.global_step), self._progress(trainer, pl_module)
            self._log_report(trainer, report, step, progress, at_fit_end=at_fit_end)

    def _log_report(
        self, trainer: pl.Trainer, report: dict[str, Any], step: int, progress: int, *, at_fit_end: bool,
    ) -> None:
        """Scalars and histograms at ``step``; the density figures at fit end only."""
        # fit end right after a validation: its scalars and histograms are logged already
        logged = at_fit_end and progress == self._last_logged_round
        if not logged:
            tb.log_scalars(trainer, self._metrics(report), step)
        self._log_extras(trainer, report, step, figure=at_fit_end, histograms=not logged)
        self._last_logged_round = progress

    def _progress(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        """Rounds (DP-FedAvg) or logical DP-SGD steps taken so far."""
        if self.mode == "dpsgd" and self.injector is not None:
            return int(self.injector.steps)
        return int(getattr(pl_module, "round", trainer.global_step))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.stats is None:
            return
        self._drain(trainer, wait=False)
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        if not trainer.loggers:
            self._warn_once(
                "nologger", "CanaryAudit: no logger is attached, so estimates are not logged; "
                "they are written to the summary JSON at fit end (pass logger=TensorBoardLogger(...))",
            )
        if self.background and trainer.state.fn == "fit" and not _last_validation(trainer):
            self._submit_estimate(trainer, pl_module)
        else:
            self._estimate_and_log(trainer, pl_module, at_fit_end=False)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stats is None:
            return
        self._estimate_and_log(trainer, pl_module, at_fit_end=True)
        report = self.last_report
        inputs: dict[str, Any] = {
            "training": "Opacus DP-SGD" if self.mode == "dpsgd" else "DP-FedAvg",
            "num_canaries": self.num_canaries,
            "num_unobserved": self.num_unobserved,
            "dim": self.stats.dim,
            "delta": self._delta(pl_module),
            "alpha": self.alpha,
            "seed": self.seed,
            "participations_histogram": np.bincount(self.participations).tolist(),
        }
        if self.mode == "dpsgd":
            assert self.injector is not None
            opt = self.injector.optimizer
            inputs.update({
                "steps": self.injector.steps,
                "steps_skipped_non_finite": self.stats.rounds_skipped,
                "noise_multiplier": float(opt.noise_multiplier),
                "max_grad_norm": float(opt.max_grad_norm),
                "expected_batch_size": opt.expected_batch_size,
                "sample_rate": self.injector.sample_rate,
                "accountant": None if self._accountant is None else type(self._accountant).__name__,
            })
            threat_models = {
                "final_model": "the adversary sees only theta_T; statistic cos(c_j, theta_0 - theta_T)",
                "all_iterates": "the adversary sees every step's model; statistic max_t cos(c_j, theta_{t-1} - theta_t)",
            }
        else:
            inputs.update({
                "repeats": self.repeats,
                "rounds": int(getattr(pl_module, "round", trainer.global_step)),
                "rounds_skipped_non_finite": self.stats.rounds_skipped,
                "noise_multiplier": getattr(pl_module, "noise_multiplier", None),
                "clip_norm": getattr(pl_module, "clip_norm", None),
                "clients_per_round": getattr(pl_module, "clients_per_round", None),
                "sampling": getattr(pl_module, "sampling", None),
                "num_real_clients": getattr(pl_module, "num_real_clients", None),
            })
            threat_models = {
                "final_model": "the adversary sees only theta_T; statistic cos(c_j, theta_T - theta_0)",
                "all_iterates": "the adversary sees every round's model; statistic max_t cos(c_j, Delta_t)",
            }
        summary: dict[str, Any] = {
            "callback": "CanaryAudit",
            "paper": "Andrew et al., One-shot Empirical Privacy Estimation for Federated Learning "
                     "(ICLR 2024), Alg. 2 and 3" + ("; example-level canaries: METHODS A7" if self.mode == "dpsgd" else ""),
            "threat_models": threat_models,
            "inputs": inputs,
        }
        if report is None:
            summary["estimates"] = None
            summary["skipped"] = "fewer than 2 canaries took part"
        else:
            summary["estimates"] = report["estimates"]
            summary["analytic_epsilon"] = report["analytic_epsilon"]
            if "analytic_epsilons" in report:
                summary["analytic_epsilons"] = report["analytic_epsilons"]
            summary["max_participations"] = report["max_participations"]
            summary["num_canaries_participated"] = report["num_canaries_participated"]
            summary["fits"] = report.get("fits", {})
        if trainer.is_global_zero:
            self.summary_path = write_summary(tb.log_dir(trainer), self.summary_filename, summary)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        if self.stats is None:
            return {}
        self._drain(self._trainer_ref, wait=True)  # a checkpoint holds every estimate so far
        state = {
            "stats": self.stats.state_dict(),
            "participations": self.participations.tolist(),
            "num_canaries": self.num_canaries,
            "num_unobserved": self.num_unobserved,
        }
        if self.injector is not None:
            state["steps"] = int(self.injector.steps)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self.stats is None:
            if self.mode == "dpsgd":  # restored before configure_optimizers: apply at fit start
                self._pending_state = state_dict
                return
            warnings.warn("CanaryAudit: state loaded before setup; ignored", stacklevel=2)
            return
        self._load(state_dict)

    def _load(self, state_dict: dict[str, Any]) -> None:
        assert self.stats is not None
        self.stats.load_state_dict(state_dict["stats"])
        saved = np.asarray(state_dict["participations"], dtype=np.int64)
        if self.injector is not None:
            if saved.shape != self.participations.shape:
                raise ValueError("checkpointed canary participations do not match this run's canaries")
            self.participations[:] = saved  # shared with the injector
            self.injector.steps = int(state_dict.get("steps", 0))
        else:
            self.participations = saved.copy()
        self._restored = True


def _update_device_dtype(pl_module: Any) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the module's update rows: those of its first trainable parameter
    (DP-FedAvg's flat vectors), which Lightning's ``pl_module.dtype`` does not track when the
    user's model was converted before it was wrapped."""
    params = getattr(pl_module, "trainable_parameters", None)
    first = next(iter(params()), None) if callable(params) else None
    if first is not None:
        return first.device, first.dtype
    return torch.device(pl_module.device), getattr(pl_module, "dtype", torch.float32)


def _rows_and_clipped_sum(
    canaries: CanarySet, indices: list[int], clip_norm: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``clip_norm * c_j`` for j in ``indices`` ``[m, d]`` and the sum of those rows clipped as
    the module clips them ``[d]`` (run on the canary set's background thread)."""
    rows = canaries.batch(indices, scale=clip_norm)
    return rows, clipped_sum(rows, clip_norm)


def _num_batches(trainer: pl.Trainer) -> int | None:
    loader = trainer.train_dataloader
    try:
        n = len(loader)
    except TypeError:
        return None
    return int(n) if n else None


def _num_examples(trainer: pl.Trainer) -> int | None:
    loader = trainer.train_dataloader
    try:
        return int(len(loader.dataset))
    except (TypeError, AttributeError):
        return None


def _last_validation(trainer: pl.Trainer) -> bool:
    """Whether this validation ends the fit (max_steps or max_epochs reached, or stopping):
    its estimate is needed at once, at fit end."""
    if trainer.should_stop:
        return True
    if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
        return True
    max_epochs = trainer.max_epochs
    return max_epochs is not None and 0 <= max_epochs <= trainer.current_epoch + 1


def _total_rounds(trainer: pl.Trainer | None) -> int:
    if trainer is None:
        raise RuntimeError("repeats needs the trainer's length before the first round")
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total) or total < 1:
        raise ValueError("CanaryAudit(repeats=...) needs a finite run: set max_steps or max_epochs")
    return int(total)
