"""Opacus DP-SGD glue (torch + Opacus, no Lightning): find the run's ``DPOptimizer``, its
accountant and sampling rate, chain its step hook, and add gradient canaries before clipping.

Everything here works on the objects Opacus' ``PrivacyEngine.make_private`` returns; nothing is
replaced that Opacus relies on:

* the accountant keeps its single ``step_hook`` slot: :func:`chain_step_hook` installs a hook that
  calls the previous one first (``previous`` stays reachable for :func:`find_accountant`);
* gradient canaries go in through :class:`GradientCanaryInjector`, which wraps the
  optimizer's ``clip_and_accumulate`` and ``add_noise`` on the instance: once per logical step
  each joining canary becomes one more row of the per-example gradients ``p.grad_sample``, at a
  norm well above ``max_grad_norm``, so that Opacus' own clipping, summation, noise and
  ``1 / expected_batch_size`` scaling act on it as on a real example (a clipping bug moves the
  estimates); where the optimizer has no per-example gradients to extend (ghost clipping,
  per-layer or adaptive clipping) ``max_grad_norm * c_j`` is added to the clipped sum in
  ``add_noise`` instead; under data-parallel training (Opacus' ``DistributedDPOptimizer``) on
  rank 0 only, so that each canary enters the all-reduced gradient once
  (:func:`canary_placement`). Which canaries join a step is drawn by the training loader's own
  Poisson sampler where it is Opacus' (:mod:`audit_callbacks.canary_sampling`), else by the
  audit at the accountant's rate.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from opacus.accountants import IAccountant, PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.analysis.prv import domain as prv_domain
from opacus.optimizers import DPOptimizer

from audit_callbacks.canaries import CanarySet
from audit_callbacks.canary_sampling import LoaderCanarySampling

__all__ = [
    "FlatGather",
    "GradientCanaryInjector",
    "accountant_epsilon",
    "canary_placement",
    "analytic_epsilons",
    "chain_step_hook",
    "find_accountant",
    "find_dp_optimizer",
    "flat_parameters",
    "preclip_unsupported",
    "rdp_epsilon",
    "unchain_step_hook",
]


def find_dp_optimizer(optimizers: Iterable[Any]) -> DPOptimizer | None:
    """The first Opacus ``DPOptimizer`` among ``optimizers`` (e.g. ``trainer.optimizers``)."""
    for opt in optimizers:
        inner = getattr(opt, "optimizer", opt)  # LightningOptimizer wraps the real one
        for candidate in (opt, inner):
            if isinstance(candidate, DPOptimizer):
                return candidate
    return None


def _hook_closure(hook: Callable[..., Any] | None) -> dict[str, Any]:
    if hook is None:
        return {}
    try:
        return dict(inspect.getclosurevars(hook).nonlocals)
    except (TypeError, ValueError):  # builtins, partials: nothing to read
        return {}


def find_accountant(optimizer: DPOptimizer) -> tuple[IAccountant | None, float | None]:
    """The accountant and the sampling rate the optimizer's step hook reports to.

    ``PrivacyEngine.make_private`` attaches ``accountant.get_optimizer_hook_fn(sample_rate)``, a
    closure over the accountant (``self``) and ``sample_rate`` (Opacus 1.x). Hooks chained by
    :func:`chain_step_hook` are followed through their ``previous`` hook.

    Returns:
        ``(accountant, sample_rate)``; either is None when the hook does not reveal it.
    """
    hook = optimizer.step_hook
    for _ in range(32):  # chained hooks, each holding the previous one
        if hook is None:
            break
        cells = _hook_closure(hook)
        acc = next((v for v in cells.values() if isinstance(v, IAccountant)), None)
        if acc is not None:
            rate = cells.get("sample_rate")
            return acc, (float(rate) if isinstance(rate, (int, float)) else None)
        hook = getattr(hook, "previous", None)
    return None, None


def chain_step_hook(optimizer: DPOptimizer, fn: Callable[[DPOptimizer], None]) -> Callable[[DPOptimizer], None]:
    """Install ``fn`` in the optimizer's single ``step_hook`` slot, after the existing hook.

    The installed hook calls the previous hook (the accountant's, usually) and then ``fn``; it
    runs after clipping, noise and scaling, before the parameters move, so ``p.grad`` is the
    privatized gradient. Returns the installed hook (pass it to :func:`unchain_step_hook`).
    """
    def hook(optim: DPOptimizer) -> None:
        previous = hook.previous  # type: ignore[attr-defined]  # read at call time: unchaining
        if previous is not None:  # a hook below this one replaces this attribute
            previous(optim)
        fn(optim)

    hook.previous = optimizer.step_hook  # type: ignore[attr-defined]
    hook.audit_fn = fn  # type: ignore[attr-defined]
    optimizer.step_hook = hook
    return hook


def unchain_step_hook(optimizer: DPOptimizer, installed: Callable[[DPOptimizer], None]) -> None:
    """Remove a hook installed by :func:`chain_step_hook`, keeping every other hook in place."""
    parent, hook = None, optimizer.step_hook
    while hook is not None:
        if hook is installed:
            prev = getattr(hook, "previous", None)
            if parent is None:
                optimizer.step_hook = prev
            else:
                parent.previous = prev  # type: ignore[attr-defined]
            return
        parent, hook = hook, getattr(hook, "previous", None)


def flat_parameters(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The optimizer's parameters, flattened and concatenated: ``[d]`` float32 on the first
    parameter's device (the model's; no copy to the host: the release deltas and the statistics
    stay there)."""
    device = params[0].device
    return torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in params])


class FlatGather:
    """Tensors of fixed shapes gathered into one persistent flat buffer, by one
    ``torch._foreach_copy_`` a call (issue 28: a fresh ``torch.cat`` of per-tensor flattened
    views cost three dispatched ops a tensor and a new ``[d]`` allocation every step; this is
    one dispatched op, on CUDA multi-tensor kernels where the dtypes agree, and no allocation
    after the first call).

    The values are those of ``torch.cat([t.reshape(-1).to(device, dtype) for t in tensors])``
    bit for bit (a copy, with the same casts). The buffer is rebuilt when the tensors' shapes,
    dtypes or devices change (a per-call check on their metadata, no device work).

    Args:
        dtype: the buffer's dtype, or None (default): the promoted dtype of the tensors
            gathered, as ``torch.cat`` would give.

    Attributes:
        flat: the last buffer ``[d]`` on the first tensor's device (None before the first
            :meth:`gather`).
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._key: tuple[Any, ...] | None = None

    def gather(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Copy ``tensors`` (in order) into the buffer and return it: ``[sum of numels]`` on the
        first tensor's device. The buffer is overwritten by the next call: copy it to keep it.
        Autograd does not record the copy.

        Raises:
            ValueError: no tensors.
        """
        if not len(tensors):
            raise ValueError("tensors: none given")
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        if key != self._key:
            self._build(tensors, key)
        with torch.no_grad():
            torch._foreach_copy_(self._views, list(tensors))
        assert self.flat is not None
        return self.flat

    def _build(self, tensors: Sequence[torch.Tensor], key: tuple[Any, ...]) -> None:
        dtype = self.dtype
        if dtype is None:
            dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
        flat = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=tensors[0].device)
        views, offset = [], 0
        for t in tensors:
            views.append(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        self.flat, self._views, self._key = flat, views, key


@functools.lru_cache(maxsize=64)
def _rdp_one_step(sample_rate: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    out = rdp_analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders))
    out.setflags(write=False)
    return out


def rdp_epsilon(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Opacus ``RDPAccountant(history).get_epsilon(delta)``, bit for bit, at a fraction of the cost.

    RDP composes additively and Opacus computes ``compute_rdp(q, sigma, steps) = steps *
    rdp(q, sigma)``; the per-step vector over the accountant's default orders (the expensive
    part: fractional orders are series sums, ~0.3 s) is cached per ``(q, sigma)``, so logging
    the accountant's epsilon every epoch costs microseconds after the first call.

    Args:
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]`` (Opacus' ``history``).
        delta: target delta in (0, 1).

    Returns:
        epsilon (0.0 for an empty history, as Opacus).
    """
    if not history:
        return 0.0
    orders = tuple(RDPAccountant.DEFAULT_ALPHAS)
    rdp = sum([_rdp_one_step(float(q), float(nm), orders) * steps for nm, q, steps in history])
    eps, _ = rdp_analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


class _CachedRDPAccountant(RDPAccountant):
    """Opacus' ``RDPAccountant`` whose ``get_epsilon`` at the default orders goes through the
    cached :func:`rdp_epsilon` (the same number, bit for bit); other orders: Opacus' own."""

    def get_epsilon(self, delta: float, alphas: Any = None, **kwargs: Any) -> float:
        if alphas is None:
            return rdp_epsilon(self.history, delta)
        return super().get_epsilon(delta, alphas, **kwargs)


_PRV_DOMAIN_LOCK = threading.RLock()


def _prv_epsilon(accountant: IAccountant, delta: float) -> float:
    """``accountant.get_epsilon(delta=delta)`` of a ``PRVAccountant``, unchanged, except that
    the two RDP epsilons Opacus' ``compute_safe_domain_size`` takes to size the PRV's domain
    (Gopi et al. 2021, Remark 5.6) go through the cached :func:`rdp_epsilon`: equal bit for
    bit, and 43-52 -> 17-26 ms at the histories of a 1-3 epoch CIFAR-sized run (the per-step
    RDP over Opacus' default orders is a series sum for the fractional ones, which Opacus
    recomputes at every call). The domain module's ``RDPAccountant`` name is swapped for the
    duration of the call, under a (re-entrant) lock, and put back even when the accountant
    raises; a concurrent PRV computation elsewhere would see the cached subclass, whose
    answers are Opacus' own."""
    with _PRV_DOMAIN_LOCK:
        own = prv_domain.RDPAccountant
        prv_domain.RDPAccountant = _CachedRDPAccountant
        try:
            return float(accountant.get_epsilon(delta=delta))
        finally:
            prv_domain.RDPAccountant = own


def accountant_epsilon(accountant: IAccountant | None, delta: float) -> float | None:
    """The accountant's epsilon at ``delta`` (None if unknown or not finite); RDP accountants
    go through the cached :func:`rdp_epsilon`, Opacus' PRV accountant through
    :func:`_prv_epsilon` (its domain's RDP bound cached), others through ``get_epsilon``."""
    if accountant is None or not getattr(accountant, "history", None):
        return None
    try:
        if type(accountant) is RDPAccountant:
            eps = rdp_epsilon(accountant.history, delta)
        elif type(accountant) is PRVAccountant:
            eps = _prv_epsilon(accountant, delta)
        else:
            eps = float(accountant.get_epsilon(delta=delta))
    except (ValueError, RuntimeError, OverflowError, ZeroDivisionError, FloatingPointError):
        return None
    return eps if np.isfinite(eps) else None


def analytic_epsilons(history: Sequence[tuple[float, float, int]], delta: float) -> dict[str, float | None]:
    """Epsilon of a DP-SGD run from its accountant history, with Opacus' RDP and PRV accountants.

    Args:
        history: ``[(noise_multiplier, sample_rate, num_steps), ...]`` as kept by Opacus'
            accountants (``accountant.history``).
        delta: target delta in (0, 1).

    Returns:
        ``{"rdp": eps, "prv": eps}``; None where the accountant cannot answer (no steps yet, or
        the PRV accountant's numerical domain is exceeded).

    Source: Opacus' ``RDPAccountant`` and ``PRVAccountant`` (epsilon(delta) after t steps at rate q).
    """
    if not history:
        return {"rdp": None, "prv": None}
    rdp, prv = _analytic_epsilons(tuple(tuple(h) for h in history), float(delta))
    return {"rdp": rdp, "prv": prv}


@functools.lru_cache(maxsize=32)
def _analytic_epsilons(history: tuple[tuple[float, float, int], ...], delta: float
                       ) -> tuple[float | None, float | None]:
    """(RDP, PRV) epsilons of ``history`` at ``delta``, cached: the PRV accountant's epsilon
    costs ~0.2-0.4 s, and a report and the summary at fit end ask for the same history."""
    out = []
    for cls in (RDPAccountant, PRVAccountant):
        acc = cls()
        acc.history = list(history)
        out.append(accountant_epsilon(acc, delta))
    return out[0], out[1]


_DISTRIBUTED_FIX = (
    "wrap the network in opacus.distributed.DifferentiallyPrivateDistributedDataParallel "
    "(DPDDP) before PrivacyEngine.make_private, so that Opacus returns a DistributedDPOptimizer "
    "(noise on rank 0 only, privatized gradients averaged across ranks), and give make_private "
    "the whole training set's loader (Trainer(use_distributed_sampler=False) with "
    "poisson_sampling=True lets Opacus' DistributedUniformWithReplacementSampler shard it)"
)


def _supported_distributed() -> tuple[type, ...]:
    """Opacus' distributed optimizers whose ``add_noise`` adds noise on rank 0 only and whose
    ``step`` all-reduces ``p.grad`` afterwards (the flat-clipping ones)."""
    from opacus.optimizers import DistributedDPOptimizer, DistributedDPOptimizerFastGradientClipping

    return (DistributedDPOptimizer, DistributedDPOptimizerFastGradientClipping)


def _unsupported_distributed() -> tuple[type, ...]:
    """Opacus' distributed optimizers the canaries cannot enter through ``add_noise``: the
    per-layer one adds noise in backward hooks; the FSDP one holds parameter shards."""
    from opacus.optimizers import FSDPOptimizerFastGradientClipping
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    return (DistributedPerLayerOptimizer, FSDPOptimizerFastGradientClipping)


def canary_placement(optimizer: DPOptimizer, world_size: int = 1) -> tuple[bool, float]:
    """Where and with what weight a canary enters the clipped sum of ``optimizer``.

    Opacus' data-parallel DP-SGD (``DistributedDPOptimizer``): every rank clips and sums its own
    examples' gradients into ``p.summed_grad``; ``add_noise`` adds the noise on rank 0 only (the
    other ranks set ``p.grad = p.summed_grad``); ``scale_grad`` divides by
    ``expected_batch_size * accumulated_iterations``, where ``make_private`` has set
    ``expected_batch_size`` to the *per-rank* expected batch ``B / world_size`` (B the global
    expected batch); ``reduce_gradients`` then all-reduces ``p.grad`` (SUM) and divides by
    ``world_size`` (``loss_reduction="mean"``). A real example's clipped gradient ``g`` on any rank
    thus reaches the global gradient as ``g / (B / W) / W = g / B``, exactly as in one process
    with expected batch B, and a canary added to rank 0's ``summed_grad`` alone with weight
    ``max_grad_norm`` reaches it as ``max_grad_norm * c / B``: the weight of one example, so the
    scale is 1 (with ``loss_reduction="sum"`` nothing is divided and the same holds). Adding it
    on every rank, as a one-process injector would, counts it ``world_size`` times.

    Args:
        optimizer: the run's ``DPOptimizer``.
        world_size: the number of training processes (``trainer.world_size``).

    Returns:
        ``(insert_here, scale)``: whether this process adds the canaries, and their weight in
        units of ``max_grad_norm`` (1.0).

    Raises:
        RuntimeError: ``world_size > 1`` with a non-distributed ``DPOptimizer`` (each rank would
            add its own full noise to its own gradient, and Lightning's DDP averages the raw
            gradients during backward, before Opacus overwrites ``p.grad``, so the ranks' models
            drift apart and the accountant is charged each rank's own rate; the message names the
            fix), with Opacus' per-layer or FSDP distributed optimizers, or a distributed
            optimizer whose world size differs from ``world_size``.
    """
    if isinstance(optimizer, _unsupported_distributed()):
        raise RuntimeError(
            f"CanaryAudit: gradient canaries support Opacus' flat-clipping data-parallel "
            f"optimizers (DistributedDPOptimizer), not {type(optimizer).__name__} (its noise is "
            "added per layer in backward hooks or on parameter shards); use clipping='flat' "
            "with DPDDP"
        )
    if isinstance(optimizer, _supported_distributed()):
        opt_world = int(getattr(optimizer, "world_size", 1))
        if world_size not in (1, opt_world):
            raise RuntimeError(f"CanaryAudit: the trainer runs {world_size} processes, Opacus' "
                               f"{type(optimizer).__name__} {opt_world}")
        return int(getattr(optimizer, "rank", 0)) == 0, 1.0
    if world_size > 1:
        raise RuntimeError(
            f"CanaryAudit: the trainer runs {world_size} processes (DDP) but the optimizer is a "
            f"one-process Opacus {type(optimizer).__name__}: every rank adds its own noise and "
            "steps with its own privatized gradient (Lightning's DDP averages the gradients before "
            "Opacus replaces them), the accountant is charged each rank's own sampling rate, and "
            f"the audit would not describe the run. Fix: {_DISTRIBUTED_FIX}"
        )
    return True, 1.0


def preclip_unsupported(optimizer: Any) -> str | None:
    """Why canaries cannot enter ``optimizer`` as per-example gradients before clipping (None
    when they can: Opacus' flat-clipping ``DPOptimizer``, ``DistributedDPOptimizer`` and their
    subclasses, whose ``clip_and_accumulate`` clips the rows of ``p.grad_sample``)."""
    from opacus.optimizers import (
        AdaClipDPOptimizer,
        DPOptimizerFastGradientClipping,
        DPPerLayerOptimizer,
    )
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    if isinstance(optimizer, DPOptimizerFastGradientClipping):
        return (f"{type(optimizer).__name__} (ghost clipping) keeps no per-example gradients to "
                "extend: the clipping runs in the backward pass")
    if isinstance(optimizer, (DPPerLayerOptimizer, DistributedPerLayerOptimizer)):
        return f"{type(optimizer).__name__} clips each layer to its own norm"
    if isinstance(optimizer, AdaClipDPOptimizer):
        return ("AdaClipDPOptimizer adapts its clipping norm to the fraction of clipped examples, "
                "which canary examples would bias")
    if not isinstance(optimizer, DPOptimizer) or not callable(getattr(optimizer, "clip_and_accumulate", None)):
        return f"{type(optimizer).__name__} is not an Opacus DPOptimizer with clip_and_accumulate"
    return None


def _tensors(grad_sample: Any) -> list[torch.Tensor] | None:
    """The tensors of a ``p.grad_sample`` (a tensor, or a list of them under accumulation)."""
    if isinstance(grad_sample, torch.Tensor):
        return [grad_sample]
    if isinstance(grad_sample, list) and grad_sample and all(isinstance(t, torch.Tensor) for t in grad_sample):
        return list(grad_sample)
    return None


class GradientCanaryInjector:
    """Insert example-level gradient canaries into a ``DPOptimizer`` (Andrew et al., ICLR 2024,
    with a canary in the place of a training example).

    Where a canary enters (``insertion``). By default **before clipping**: the optimizer's
    ``clip_and_accumulate`` is wrapped on the instance (so a subclass's or an instance's own
    override still runs on the canaries too), and at the first ``clip_and_accumulate`` of each
    logical step, right after the real examples' call, it is called a second time with every
    parameter's per-example gradients ``p.grad_sample`` set to one row per joining canary:
    ``norm_multiplier * max_grad_norm * c_j`` cut into the parameters' shapes, so Opacus' own
    per-sample norm, clip factor ``min(1, C / (norm + 1e-6))`` and summation into
    ``p.summed_grad`` (then its noise and scaling) act on it as on a real example, and with
    correct clipping the canary adds ``max_grad_norm * c_j`` (times ``1 - 1e-6 /
    (norm_multiplier C)``) to the summed gradient; clipping at 2C doubles it. The real
    per-example gradients are never copied or extended (before issue 28 the rows were
    concatenated to them: a copy of all B x d every step) and are put back right after the
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
    t])`` at step ``t``. With ``sampling`` (:class:`~audit_callbacks.canary_sampling.
    LoaderCanarySampling`) the training loader's own Poisson sampler draws them, and the step
    takes the draws of its ``accumulated_iterations`` batches (a canary drawn in two accumulated
    batches enters twice, as a real example would). Participations are counted when the step is
    released (``add_noise``).

    Data-parallel training (Opacus' ``DistributedDPOptimizer``, the optimizer ``make_private``
    returns for a ``DPDDP`` model): every rank makes the same draws and counts the same
    participations, but only rank 0 inserts the canaries, so that after Opacus' all-reduce each
    canary has the weight of one real example's clipped gradient (:func:`canary_placement`).
    ``sample_rate`` is then the rate of one example in the *global* logical batch.

    Observer (e.g. :meth:`audit_callbacks.steps_unknown.StepsUnknownScores.update`): called once
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
    step to step (one copy a step, issue 28): an observer that keeps it must copy it.

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
        # of them), made once per m and buffer (issue 28: no view ops per step)
        self._row_views: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._noisy = FlatGather()  # the noisy sum given to the observer, reused across steps
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
        if self.sampling is not None:
            self._joined = self.sampling.take(batches, self.steps)
        else:
            self._joined = self.joined(self.steps, self._rate)
        self._placed = not (self.inserts and self._joined.size)

    def _clip_and_accumulate(self) -> None:
        assert self._clip_original is not None
        self._begin_step()
        if self._placed or not self.before_clipping:
            self._clip_original()
            return
        layout = self._canary_layout()
        if layout is None:  # Opacus raises its own error, or the step falls back (insertion says why)
            self._clip_original()
            return
        self._clip_original()  # the real examples, as they are: nothing of theirs is copied
        self._placed = True
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
        buf = self._rows_buffer
        if buf is None or buf.shape[0] < m or buf.device != first_device:
            # reused from step to step (grown by 8 rows at a time): a fresh m x d allocation
            # costs its page faults on the CPU at every step
            buf = self._rows_buffer = torch.empty(-(-m // 8) * 8, self.canaries.dim, dtype=torch.float32,
                                                  device=first_device)
            self._row_views = {}
        views = self._row_views.get(m)
        if views is None:
            if len(self._row_views) >= 64:  # Poisson batches vary m: keep the cache bounded
                self._row_views.clear()
            views = self._row_views[m] = (buf[:m], self._parameter_views(buf[:m], layout))
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
        self._noisy = FlatGather()
        self.set_observer(None)
