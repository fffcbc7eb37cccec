"""The inference attack on LDP-FL's two-point mechanism (Varun et al. 2024 §3.1, eq. 2 and eq. 10).

Numpy only. An honest-but-curious server stores, round after round, the perturbed values that
clients send for a weight. Because the two-point mechanism (Sun et al. 2021; Varun et al. 2024 eq. 1;
docs/methods/ldp.md, C5) is unbiased and its two outputs do not depend on the input, the share p of "high"
outputs over many rounds pins down the weight the clients converge to:

    w_hat = c + r (e^eps + 1)(2p - 1) / (e^eps - 1)                               (eq. 2)

which is the mean of the released values. Each round the server splits its history at random into
two halves, predicts from each, and scores its confidence

    CS = 1 / (0.01 + |w_hat_2 - w_hat_1| / (2r))                                  (eq. 10)

The error metric is |w_hat - w_mean| / (2r), relative to the domain [c - r, c + r].

Against another randomizer (staircase SRR, GRR) the attack uses the same idea with that
mechanism's own inversion of the mean: ``invert(mean of released values)`` (default: identity,
exact for any unbiased mechanism). For SRR the mean is biased towards the grid centre by an amount
that depends on the unknown weight, which is what Varun et al. 2024 §5 credits for its robustness.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from audit_callbacks.validation import as_float_array, check_positive, check_real, check_seed

__all__ = ["InferencePrediction", "LDPFLInferenceAttack", "two_point_prediction"]


def two_point_prediction(p: ArrayLike, epsilon: float, center: float, radius: float) -> np.ndarray:
    """Varun et al. (2024) eq. 2: the weight predicted from the share ``p`` of high outputs.

    ``c + r (2p - 1) / tanh(eps/2)`` (= eq. 2's ``(e^eps + 1)/(e^eps - 1)``, without overflow).

    Args:
        p: share(s) of high outputs, floats in [0, 1], any shape (tensors are converted).
        epsilon: per-coordinate epsilon of the two-point mechanism, > 0 and finite. At 0 the
            outputs carry no information about the weight (eq. 2 divides by e^0 - 1 = 0), so
            no prediction exists.
        center, radius: the domain ``[c - r, c + r]``, c finite, r > 0.

    Returns:
        float64 array of p's shape.

    Raises:
        ValueError: epsilon <= 0 or not finite; p not floats in [0, 1] (NaN, inf, booleans);
            center not finite; radius <= 0 or not finite.
    """
    e = check_positive(epsilon, "epsilon")
    c = check_real(center, "center")
    r = check_positive(radius, "radius")
    share = as_float_array(p, "p", allow_int=True)
    if not np.all(np.isfinite(share)) or np.any(share < 0.0) or np.any(share > 1.0):
        raise ValueError("p must be shares in [0, 1] (no NaN or inf)")
    return c + r * (2.0 * share - 1.0) / math.tanh(e / 2.0)


@dataclass(frozen=True)
class InferencePrediction:
    """The attack's state after a round.

    Attributes:
        rounds: rounds observed so far.
        prediction: ``[d]`` predicted weights (eq. 2 on the whole history).
        prediction_1, prediction_2: ``[d]`` predictions from the two random halves (None with
            fewer than 2 rounds).
        confidence: ``[d]`` confidence scores CS (eq. 10), in (0, 100]; None with < 2 rounds.
        error: ``[d]`` |prediction - target| / (2r) when a target was given, else None.
    """

    rounds: int
    prediction: np.ndarray
    prediction_1: np.ndarray | None
    prediction_2: np.ndarray | None
    confidence: np.ndarray | None
    error: np.ndarray | None


class LDPFLInferenceAttack:
    """Accumulates released values round by round and predicts the clients' weights.

    Args:
        center, radius: the mechanism's domain ``[c - r, c + r]`` (r > 0).
        invert: maps the mean of the released values to a predicted weight (default: identity,
            which is eq. 2 for the two-point mechanism and exact for any unbiased mechanism).
        seed: seed of the random split of the history into halves (non-negative integer).

    Raises:
        ValueError: center not finite, radius not finite > 0, invert not callable, a bad seed.

    Memory: two ``[rounds, d]`` float64 arrays (per-round sums and counts of released values).
    """

    def __init__(
        self, center: float = 0.0, radius: float = 1.0, *,
        invert: Callable[[np.ndarray], np.ndarray] | None = None, seed: int = 0,
    ) -> None:
        self.center = check_real(center, "center")
        self.radius = check_positive(radius, "radius")
        if invert is not None and not callable(invert):
            raise ValueError(f"invert must be callable, got {invert!r}")
        self.invert = invert or (lambda m: m)
        self._rng = np.random.default_rng(check_seed(seed))
        self._sums: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []

    @property
    def rounds(self) -> int:
        return len(self._sums)

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state (lists and ints: loadable by Lightning's weights-only checkpoints)."""
        return {
            "sums": [v.tolist() for v in self._sums],
            "counts": [v.tolist() for v in self._counts],
            "rng": _plain(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the next prediction equals an uninterrupted run's."""
        self._sums = [np.asarray(v, dtype=float) for v in state["sums"]]
        self._counts = [np.asarray(v, dtype=float) for v in state["counts"]]
        self._rng.bit_generator.state = state["rng"]

    def observe(self, released: ArrayLike) -> None:
        """Store one round: ``released`` is ``[n]`` (one weight) or ``[n, d]`` (n clients).

        Raises:
            ValueError: released is empty, NaN/inf, boolean or complex, has another number of
                weights than earlier rounds, or more than 2 dimensions.
        """
        arr = as_float_array(released, "released", allow_int=True)
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2 or arr.shape[0] < 1:
            raise ValueError(f"released must be [n] or [n, d] with n >= 1, got {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("released values contain NaN or inf")
        if self._sums and arr.shape[1] != self._sums[0].shape[0]:
            raise ValueError(f"expected {self._sums[0].shape[0]} weights, got {arr.shape[1]}")
        self._sums.append(arr.sum(0))
        self._counts.append(np.full(arr.shape[1], float(arr.shape[0])))

    def _predict(self, rows: np.ndarray) -> np.ndarray:
        sums = np.sum([self._sums[i] for i in rows], axis=0)
        counts = np.sum([self._counts[i] for i in rows], axis=0)
        return np.asarray(self.invert(sums / counts), dtype=float)

    def predict(self, target: ArrayLike | None = None) -> InferencePrediction:
        """Predict from the whole history and from two random halves (Varun et al. 2024 §3.1 steps 1-4).

        Args:
            target: optional ``[d]`` (or scalar) true mean weight, for the error metric.

        Raises:
            RuntimeError: before any round was observed (a call-order error, not an argument).
            ValueError: a target that is NaN/inf, boolean or not a scalar or ``[d]`` array.
        """
        if not self._sums:
            raise RuntimeError("no round observed yet")
        tgt = None
        if target is not None:
            tgt = as_float_array(target, "target", allow_int=True)
            d = self._sums[0].shape[0]
            if not np.all(np.isfinite(tgt)) or tgt.ndim > 1 or tgt.size not in (1, d):
                raise ValueError(f"target must be a finite scalar or [{d}] array")
        n = self.rounds
        prediction = self._predict(np.arange(n))
        p1 = p2 = conf = None
        if n >= 2:
            perm = self._rng.permutation(n)
            half = n // 2
            p1 = self._predict(perm[:half])
            p2 = self._predict(perm[half:])
            conf = 1.0 / (0.01 + np.abs(p2 - p1) / (2.0 * self.radius))
        error = None
        if tgt is not None:
            error = np.abs(prediction - tgt) / (2.0 * self.radius)
        return InferencePrediction(n, prediction, p1, p2, conf, error)


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
