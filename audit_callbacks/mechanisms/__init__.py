"""Local-DP client randomizers (torch, batched over rows ``[B, d]``) and their exact audit.

Each :class:`LocalRandomizer` randomizes every row (one client's update) independently, states
the epsilon it claims (``epsilon0``; ``epsilon_for_dim(d)`` for a whole d-dim row), and gives the
server-side correction (``debias``, ``aggregate``). The discrete per-coordinate ones also give
their exact output law, audited by :func:`exact_epsilon`.

- :class:`LDPSGD`: gradient randomized response (docs/methods/ldp.md, C1; Alg. 1 of Matsumoto et al.).
- :class:`TwoPoint`: LDP-FL two-point mechanism (C5; eq. 1 of 002).
- :class:`Staircase`: staircase randomized response, SRR-FL (C6; §4.3-4.4 of 002).
- :class:`BrokenStaircase`: the public SRR-FL reference code's staircase (not eps-LDP), and a
  per-group normalisation defect, for the audit to catch.
- :class:`GRR`: generalized randomized response on the same grid.
- :class:`GaussianRandomizer`: clip + Gaussian noise, (eps, delta)-LDP.
"""

from audit_callbacks.mechanisms.base import (
    ExactAudit,
    LocalRandomizer,
    PerCoordinateRandomizer,
    exact_epsilon,
    exact_epsilon_witness,
)
from audit_callbacks.mechanisms.gaussian import GaussianRandomizer
from audit_callbacks.mechanisms.grid import GRR, GridRandomizer
from audit_callbacks.mechanisms.ldp_sgd import LDPSGD, sphere_sign_constant
from audit_callbacks.mechanisms.staircase import (
    BrokenStaircase,
    Staircase,
    reference_group_sizes,
    staircase_alphas,
    staircase_group_sizes,
    staircase_max_delta,
)
from audit_callbacks.mechanisms.two_point import TwoPoint

__all__ = [
    "GRR",
    "LDPSGD",
    "BrokenStaircase",
    "ExactAudit",
    "GaussianRandomizer",
    "GridRandomizer",
    "LocalRandomizer",
    "PerCoordinateRandomizer",
    "Staircase",
    "TwoPoint",
    "exact_epsilon",
    "exact_epsilon_witness",
    "reference_group_sizes",
    "sphere_sign_constant",
    "staircase_alphas",
    "staircase_group_sizes",
    "staircase_max_delta",
]
