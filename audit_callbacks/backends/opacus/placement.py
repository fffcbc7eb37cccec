"""Where gradient canaries enter an Opacus optimizer: before clipping as extra per-example rows,
or after it, and on which data-parallel rank."""

from __future__ import annotations

from typing import Any

from opacus.optimizers import DPOptimizer

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


