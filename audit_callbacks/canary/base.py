"""What every canary statistic implements, what one release is, and which statistic a
training's releases get.

A backend describes the mechanism of its releases once (:class:`NoisyAverageDelta`,
:class:`NoisySum`, or :class:`NoMatchedStatistic` with the reason) and emits each release to
the :class:`~audit_callbacks.auditing.CanaryAuditor`; the auditor builds every statistic from
that description (:func:`matched_statistic`), projects each released vector once
(:class:`~audit_callbacks.canary.projection.Projection`) and folds the same
:class:`Release` into each statistic that reads it.

A new statistic is a class that implements :class:`CanaryStatistic` and one entry of
:data:`MATCHED` (the statistic matched to the analytic epsilon's adversary) or of
:data:`CHECKS` (further statistics of the same releases, e.g. checks of the mechanism).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from audit_callbacks.canary.projection import Projection
from audit_callbacks.canary.vectors import CanarySet

__all__ = ["CHECKS", "MATCHED", "CanaryStatistic", "NoMatchedStatistic", "NoisyAverageDelta", "NoisySum",
           "Release", "ReleaseModel", "further_statistics", "matched_statistic"]

#: Which vector of a release a statistic reads.
Reads = Literal["model_delta", "noisy_sum"]


@dataclass(frozen=True)
class Release:
    """One released vector, as every statistic reads it.

    Attributes:
        projection: the vector and its dot products with every canary (computed once, shared
            by the statistics of this release).
        participants: ``[m]`` local indices in ``0..k-1`` of the observed canaries that took
            part (repeats allowed), or None.
        rate: the release's Poisson sampling rate q in (0, 1] (DP-SGD's noisy sums), or None.
        batch_size: the real examples in the step's batch (DP-SGD), or None when unknown.
        batch_rate: the real examples' Poisson rate q of the step where it differs from the
            canaries' ``rate`` (a canary rate the user gave), or None (``rate``).
        batches: the Poisson batches summed into the step (gradient accumulation), >= 1.
        extras: the release's change of the arrays of a release model's ``extra_tensors``
            (flat), or None.
    """

    projection: Projection
    participants: np.ndarray | None = None
    rate: float | None = None
    batch_size: int | None = None
    batches: int = 1
    batch_rate: float | None = None
    extras: torch.Tensor | None = None

    @property
    def vector(self) -> torch.Tensor:
        """The released vector ``[d]``."""
        return self.projection.vector


@runtime_checkable
class CanaryStatistic(Protocol):
    """A statistic of the canaries over the releases, owned by the auditor.

    Attributes:
        name: its name (``"max_cosine"``, ``"known_rounds"``, ``"steps_unknown"``...).
        reads: which vector of a release it folds (``"model_delta"`` or ``"noisy_sum"``).
        state_key: its key in the auditor's checkpoint.
    """

    name: str
    reads: Reads
    state_key: str

    def fold(self, release: Release) -> torch.Tensor:
        """Fold one release on its device with no host synchronisation; returns a 0-dim bool
        tensor: whether it was folded (False: a NaN or inf vector, skipped and counted)."""
        ...

    def scores(self) -> tuple[np.ndarray, np.ndarray]:
        """``(observed, unobserved)`` float64 scores, higher meaning "took part"."""
        ...

    def estimate(self, delta: float, *, alpha: float = 0.05, bootstrap: int = 0,
                 seed: int = 0) -> Any:
        """Its epsilon estimate (an :class:`~audit_callbacks.estimators.AuditResult`);
        ValueError when there is none yet (the message says why)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


# ---------------------------------------------------------------------------- release models
@dataclass(frozen=True)
class NoisyAverageDelta:
    """A release is a model delta of server SGD on a noisy average: ``Delta_t = beta
    Delta_{t-1} + eta (sum of clipped updates + N(0, (z C)^2 I)) / divisor`` (DP-FedAvg and
    Flower's DP wrappers).

    Attributes:
        clip_norm: C > 0. divisor: m >= 1, the fixed cohort size the noisy sum is divided by.
        noise_multiplier: z > 0. server_lr: eta > 0. server_momentum: beta in [0, 1).
        tensors: ``((name, numel), ...)`` of the flat delta's parameter tensors, in order (empty:
            unknown, no per-tensor noise checks).
        extra_tensors: ``((name, numel), ...)`` of arrays released beside the model that carry no
            canary (a Flower model's integer buffers), given with each release as its
            ``extras``; the noise checks cover them too.
    """

    clip_norm: float
    divisor: int
    noise_multiplier: float
    server_lr: float = 1.0
    server_momentum: float = 0.0
    tensors: tuple[tuple[str, int], ...] = ()
    extra_tensors: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class NoisySum:
    """A release is DP-SGD's noisy sum of clipped per-example gradients, ``g_t = sum + N(0,
    (sigma C)^2 I)``, with each example (canary) in it with the release's Poisson rate q_t.

    Attributes:
        max_grad_norm: C > 0. noise_multiplier: sigma > 0.
        tensors: ``((name, numel), ...)`` of the flat noisy sum's parameter tensors, in order
            (empty: unknown, no per-tensor noise checks).
        population: N, the training examples the batches are drawn from (None: unknown, no
            sampler check).
    """

    max_grad_norm: float
    noise_multiplier: float
    tensors: tuple[tuple[str, int], ...] = ()
    population: int | None = None


@dataclass(frozen=True)
class NoMatchedStatistic:
    """No statistic matched to the analytic epsilon's adversary applies; ``reason`` says why
    (Gaussian canaries, local DP, no noise, an unknown server optimizer...)."""

    reason: str


ReleaseModel = NoisyAverageDelta | NoisySum | NoMatchedStatistic


def _known_rounds(model: NoisyAverageDelta, canaries: CanarySet, k: int, k_un: int,
                  max_buffered: int) -> CanaryStatistic:
    from audit_callbacks.canary.known_rounds import KnownRoundScores

    return KnownRoundScores(canaries, k, clip_norm=model.clip_norm, divisor=model.divisor,
                            noise_multiplier=model.noise_multiplier, server_lr=model.server_lr,
                            server_momentum=model.server_momentum)


def _steps_unknown(model: NoisySum, canaries: CanarySet, k: int, k_un: int,
                   max_buffered: int) -> CanaryStatistic:
    from audit_callbacks.canary.steps_unknown import StepsUnknownScores

    return StepsUnknownScores(canaries, k, k_un, max_grad_norm=model.max_grad_norm,
                              noise_multiplier=model.noise_multiplier)


#: The statistic matched to the analytic epsilon's adversary, per kind of release: the aligned
#: sum over the known rounds (DP-FedAvg, Flower), the Neyman-Pearson statistic with the steps
#: unknown (DP-SGD).
MATCHED: dict[type, Callable[..., CanaryStatistic]] = {
    NoisyAverageDelta: _known_rounds,
    NoisySum: _steps_unknown,
}


def _noise_checks(model: ReleaseModel, canaries: CanarySet, k: int, k_un: int,
                  max_buffered: int) -> Any:
    from audit_callbacks.canary.mechanism import NoiseChecks

    if isinstance(model, NoisySum) and model.tensors:
        return NoiseChecks(model.tensors, model.noise_multiplier * model.max_grad_norm)
    if isinstance(model, NoisyAverageDelta) and model.tensors:
        std = model.noise_multiplier * model.clip_norm * model.server_lr / model.divisor
        return NoiseChecks(model.tensors, std, reads="model_delta", momentum=model.server_momentum,
                           what="round", extra_tensors=model.extra_tensors)
    return None


def _sampler_check(model: ReleaseModel, canaries: CanarySet, k: int, k_un: int,
                   max_buffered: int) -> Any:
    from audit_callbacks.canary.mechanism import SamplerCheck

    if isinstance(model, NoisySum) and model.population:
        return SamplerCheck(model.population)
    return None


#: Further statistics every audit gets beside the matched one, each built from the release
#: model, the canaries, k, k' and ``max_buffered`` (None where it does not apply); the auditor
#: folds every release into them and keeps their state under their ``state_key``. The checks
#: of the mechanism (:mod:`audit_callbacks.canary.mechanism`) also give ``results(alpha)``.
CHECKS: list[Callable[..., Any]] = [_noise_checks, _sampler_check]


def further_statistics(model: ReleaseModel, canaries: CanarySet, num_observed: int,
                       num_unobserved: int, *, max_buffered: int = 32) -> list[CanaryStatistic]:
    """The statistics of :data:`CHECKS` that apply to releases described by ``model``."""
    built = (build(model, canaries, int(num_observed), int(num_unobserved), int(max_buffered))
             for build in CHECKS)
    return [stat for stat in built if stat is not None]


def matched_statistic(model: ReleaseModel, canaries: CanarySet, num_observed: int,
                      num_unobserved: int, *, max_buffered: int = 32
                      ) -> tuple[CanaryStatistic | None, str]:
    """The matched statistic of releases described by ``model``, or None and the reason."""
    if isinstance(model, NoMatchedStatistic):
        return None, model.reason
    if isinstance(model, NoisyAverageDelta) and canaries.kind != "hadamard":
        from audit_callbacks.canary.known_rounds import GAUSSIAN_REASON

        return None, GAUSSIAN_REASON
    build = MATCHED.get(type(model))
    if build is None:
        return None, f"no statistic is matched to releases of {type(model).__name__}"
    return build(model, canaries, int(num_observed), int(num_unobserved), int(max_buffered)), ""
