"""Gaussian client randomizer (clip, then add isotropic Gaussian noise); (eps, delta)-LDP."""

from __future__ import annotations

import torch
from torch import Tensor

from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.mechanisms.base import LocalRandomizer, _check_rows
from audit_callbacks.validation import check_delta, check_positive

__all__ = ["GaussianRandomizer"]

# Any two inputs of the L2 ball of radius C are up to 2C apart: the local model's sensitivity.
LOCAL_SENSITIVITY = 2.0


class GaussianRandomizer(LocalRandomizer):
    """Clip each row to L2 norm C, add ``N(0, (z C)^2 I_d)``; unbiased (``debias`` = identity).

    Privacy: local DP protects a client's whole input, so neighbouring inputs are ANY two
    clipped rows, up to ``2C`` apart in L2. With noise sd ``z C`` the release is then
    ``mu = 2/z``-GDP and ``epsilon0 = gaussian_epsilon(z, delta, sensitivity=2)`` (analytic
    Gaussian mechanism, Balle & Wang 2018), the same for every d. (The ``sensitivity=1`` value
    ``gaussian_epsilon(z, delta)`` is the add/remove-one-client figure of central DP-FedAvg;
    it understates the LDP epsilon: the pair (g, -g) with ||g|| = C attains ``mu = 2/z``.)

    Args:
        noise_multiplier: z > 0 (noise sd in units of C).
        clip_norm: C > 0.
        delta: the delta of the claim, in (0, 1).

    Raises:
        ValueError: noise_multiplier or clip_norm not a finite real > 0 (too small a
            noise_multiplier: epsilon0 not representable); delta not a real in (0, 1).
    """

    name = "gaussian"
    per_coordinate = False
    epsilon_per_coordinate = None

    def __init__(self, noise_multiplier: float, clip_norm: float, delta: float) -> None:
        self.noise_multiplier: float = check_positive(noise_multiplier, "noise_multiplier")
        self.clip_norm: float = check_positive(clip_norm, "clip_norm")
        dl = check_delta(delta)
        self.delta: float = dl
        self.sensitivity: float = LOCAL_SENSITIVITY
        self.epsilon0: float = float(
            gaussian_epsilon(self.noise_multiplier, dl, sensitivity=LOCAL_SENSITIVITY)
        )

    @property
    def noise_std(self) -> float:
        """``z C``, the per-coordinate noise standard deviation."""
        return self.noise_multiplier * self.clip_norm

    def project(self, x: Tensor) -> Tensor:
        """L2 clipping of each row to norm C: ``[B, d] -> [B, d]``."""
        _check_rows(x)
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return x * torch.clamp(
            self.clip_norm / torch.clamp(norm, min=torch.finfo(x.dtype).tiny), max=1.0
        )

    def randomize(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``x [B, d] -> clip(x) + N(0, (z C)^2 I)`` (same dtype/device)."""
        xc = self.project(x)
        noise = torch.randn(xc.shape, generator=generator, device=xc.device, dtype=xc.dtype)
        return xc + self.noise_std * noise

    def __repr__(self) -> str:
        return (
            f"GaussianRandomizer(noise_multiplier={self.noise_multiplier!r}, "
            f"clip_norm={self.clip_norm!r}, delta={self.delta!r})"
        )
