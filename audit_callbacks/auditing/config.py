"""The canary audit's settings, validated once, shared by every front end.

``CanaryAudit`` (Lightning) and ``CanaryStrategy`` (Flower) build a :class:`CanaryAuditConfig`
from their arguments, so a bad setting raises the same ``ValueError`` (naming the argument and
the value) wherever it is given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from audit_callbacks.validation import (
    check_choice,
    check_count,
    check_optional_count,
    check_probability,
    check_real,
    check_seed,
)

__all__ = ["CANARY_KINDS", "MAX_GAUSSIAN_CANARIES", "CanaryAuditConfig"]

#: The canary constructions of :mod:`audit_callbacks.canary.vectors`.
CANARY_KINDS = ("hadamard", "gaussian")
#: Gaussian canaries: at most this many in all (k + k'). Every release regenerates each of them
#: (d floats) and every statistic keeps several floats per canary, so 10^9 would allocate
#: gigabytes before the first step; Hadamard canaries cost one transform whatever their number.
MAX_GAUSSIAN_CANARIES = 10**7


@dataclass(frozen=True)
class CanaryAuditConfig:
    """What the canary audit's numbers depend on (Andrew et al., ICLR 2024, Alg. 2 and 3).

    Args:
        num_canaries: k observed canaries, >= 2 (None: min(1000, the real population), and
            for Hadamard canaries at most n / 2, n = 2^floor(log2 d)).
        num_unobserved: k' canaries never inserted, >= 0 (None: k for Gaussian canaries,
            min(n - k, 100,000) for Hadamard canaries, n = 2^floor(log2 d); 0 disables the
            all-iterates estimate). Gaussian canaries: k + k' at most
            :data:`MAX_GAUSSIAN_CANARIES`.
        canaries: ``"hadamard"`` or ``"gaussian"`` (see :mod:`audit_callbacks.canary.vectors`).
        seed: the canaries' seed, a non-negative integer: canary j is a function of (seed, j).
            Canaries are public by design; the seed may be logged (it regenerates no DP noise).
        delta: the delta of every epsilon in (0, 1) (None: the training's own, see the backend).
        alpha: 1 - confidence of the lower bounds, in (0, 1).
        bootstrap: resamples of the estimates' percentile intervals at the end (0: none).
        repeats: DP-FedAvg only: each canary presented in ``repeats`` scheduled rounds instead
            of sampled (Andrew et al. §5.2), >= 1.
        sample_rate: DP-SGD only: the Poisson rate of a canary per logical step, in (0, 1]
            (None: the rate the Opacus accountant is charged).
        max_buffered_rounds: Gaussian canaries: model deltas buffered between passes, >= 1
            (None: as many as fit in 16 MiB). The estimates do not depend on it.
        canary_norm_multiplier: a canary's norm before clipping, in units of the clipping
            norm (Opacus' ``max_grad_norm``, DP-FedAvg's and Flower's ``clip_norm``), in
            [1, 1e6] (default 10). Canaries enter before the training's own clipping, so a
            correct clipping brings each to exactly the clipping norm and a clipping at the
            wrong norm shows in the estimates (``docs/methods.md``, "Verdicts").

    Raises:
        ValueError: any setting out of its range or of the wrong type (``2.5`` or ``True`` for
            a count, ``-1`` for a seed...), naming the argument and the value; Gaussian
            canaries with k + k' above :data:`MAX_GAUSSIAN_CANARIES` (naming ``num_canaries``
            and ``num_unobserved``).
    """

    num_canaries: int | None = None
    num_unobserved: int | None = None
    canaries: str = "hadamard"
    seed: int = 0
    delta: float | None = None
    alpha: float = 0.05
    bootstrap: int = 200
    repeats: int | None = None
    sample_rate: float | None = None
    max_buffered_rounds: int | None = None
    canary_norm_multiplier: float = 10.0

    def __post_init__(self) -> None:
        fix = {
            "num_canaries": check_optional_count(self.num_canaries, "num_canaries", minimum=2),
            "num_unobserved": check_optional_count(self.num_unobserved, "num_unobserved"),
            "canaries": check_choice(self.canaries, "canaries", CANARY_KINDS),
            "seed": check_seed(self.seed, "seed"),
            "delta": None if self.delta is None else check_probability(self.delta, "delta"),
            "alpha": check_probability(self.alpha, "alpha"),
            "bootstrap": check_count(self.bootstrap, "bootstrap"),
            "repeats": check_optional_count(self.repeats, "repeats", minimum=1),
            "sample_rate": None if self.sample_rate is None else check_probability(
                self.sample_rate, "sample_rate", high_inclusive=True),
            "max_buffered_rounds": check_optional_count(
                self.max_buffered_rounds, "max_buffered_rounds", minimum=1),
            "canary_norm_multiplier": check_real(
                self.canary_norm_multiplier, "canary_norm_multiplier", low=1.0, high=1e6),
        }
        for name, value in fix.items():
            object.__setattr__(self, name, value)
        if self.canaries == "gaussian":
            k = self.num_canaries
            k_un = self.num_unobserved if self.num_unobserved is not None else k
            total = (k or 0) + (k_un or 0)
            if total > MAX_GAUSSIAN_CANARIES:
                raise ValueError(
                    f"num_unobserved={self.num_unobserved!r} with num_canaries={k!r}: "
                    f"{total:,} Gaussian canaries in all (k + k'), above the cap of "
                    f"{MAX_GAUSSIAN_CANARIES:,}; each release regenerates every canary (d "
                    "floats each) and every statistic keeps floats per canary. Give a smaller "
                    "num_unobserved (a few thousand bound epsilon as tightly), or "
                    "canaries='hadamard', whose cost does not grow with their number"
                )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
