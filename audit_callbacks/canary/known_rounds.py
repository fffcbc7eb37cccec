"""The all-iterates statistic of DP-FedAvg when the adversary knows the rounds (torch).

The analytic epsilon of DP-FedAvg's canary audit (Andrew et al., ICLR 2024, footnote on the
unamplified Gaussian mechanism; Dong, Roth, Su 2022, Cor. 3.3) assumes an adversary who sees
every round's release and knows the rounds R_j a canary j took part in. That adversary's
statistic is the aligned sum (the Neyman-Pearson test of the composed Gaussian mechanism):

* each round's noisy aggregate is recovered from consecutive model deltas, undoing the server's
  learning rate eta and momentum beta: ``avg_t = (Delta_t - beta Delta_{t-1}) / eta``
  (PyTorch's SGD with momentum: ``Delta_t = beta Delta_{t-1} + eta avg_t``);
* in units of one clipped client update, ``y_jt = <c_j, avg_t> m / C`` is 1 + N(0, z^2) in a
  round canary j took part in and N(0, z^2) otherwise (the noise on the average is N(0, (z C /
  m)^2 I); other clients' updates add ``<c_j, u_i> / C``, about ``1 / sqrt(d)`` each);
* canary j's score is ``t_j = sum_{t in R_j} y_jt / (z sqrt(r_j))``: N(sqrt(r_j) / z, 1) for an
  observed canary, N(0, 1) for an unobserved one (whose R_j is every round: the noise of
  distinct rounds is independent, so any fixed set of rounds gives N(0, 1)).

The estimate composes the per-round shift over the most-sampled canary's rounds, as the
analytic epsilon does: ``mu_1`` is estimated from every (canary, round) participation,
``(mean y over participations - mean y over unobserved rounds) / sd(y over unobserved rounds)``,
and ``epsilon = epsilon_GDP(sqrt(r_max) mu_1, delta)`` (Dong, Roth, Su 2022, Cor. 2.13), with a
bootstrap over canaries. Only running sums are kept: O(k + k') numbers, and with server momentum
the previous model delta ``[d]``; they live on the deltas' device and a round reads nothing back
to the host (a round with NaN or inf is masked out by a device bool): the host copies
are made when the scores or the estimate are asked for.

The final-model heuristic reference (Steinke et al., "The Last Iterate Advantage", ICLR 2025):
``theta_T - theta_0 = eta sum_t w_t avg_t`` with ``w_t = (1 - beta^(T - t + 1)) / (1 - beta)``
(``w_t = 1`` without momentum), so canary j's last iterate is ``mu_j``-GDP with
``mu_j = sum_{t in R_j} w_t / (z sqrt(sum_t w_t^2))``. The sums are kept as running sums:
``A_j <- beta A_j + [j in round t]``, ``B <- beta B + 1`` and ``B2 <- beta^2 B2 + 1`` give
``sum_{t in R_j} w_t = (r_j - beta A_j) / (1 - beta)`` and ``sum_t w_t^2 = (T - 2 beta B +
beta^2 B2) / (1 - beta)^2``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from audit_callbacks.canary.base import Release
from audit_callbacks.canary.vectors import CanarySet, _index_array
from audit_callbacks.estimators import AuditResult, CanaryScoreAuditor, gaussian_epsilon_array
from audit_callbacks.validation import check_alpha, check_count, check_delta, check_seed

__all__ = ["GAUSSIAN_REASON", "SOURCE", "KnownRoundScores"]

#: Why Gaussian canaries get no known-rounds statistic: it needs every canary's projection of
#: every round, one regeneration of all k + k' canaries a round (O((k + k') d)); measured 14.6x
#: a federated fit at d = 125,626 (benchmarks/results/canary_overhead.json) against 1.8x with
#: Hadamard canaries, whose projections are one transform.
GAUSSIAN_REASON = ("Gaussian canaries: the known-rounds statistic would regenerate every canary "
                   "every round; use canaries=\"hadamard\" (the default)")

SOURCE = ("Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar (2024), One-shot Empirical Privacy "
          "Estimation for Federated Learning, ICLR, §4.1 (all iterates) with the aligned sum of "
          "the adversary who knows the rounds; Dong, Roth, Su (2022), Gaussian Differential "
          "Privacy, Cor. 2.13 and 3.3 (composition of the per-round shift)")


class KnownRoundScores:
    """Aligned sums of every canary over the rounds it took part in.

    Args:
        canaries: the audit's canary set: indices ``0..k-1`` observed, ``k..k+k'-1`` never
            inserted.
        num_observed: k.
        clip_norm: C, the clip norm of one client's update.
        divisor: m, what the noisy sum of a round is divided by (the fixed cohort size).
        noise_multiplier: z (> 0: without noise the statistic is not defined).
        server_lr, server_momentum: eta > 0 and beta in [0, 1) of the server's SGD.

    Raises:
        ValueError: z <= 0, C <= 0, m < 1, eta <= 0 or beta outside [0, 1).
    """

    name = "known_rounds"
    reads = "model_delta"
    state_key = "known_rounds"

    def __init__(self, canaries: CanarySet, num_observed: int, *, clip_norm: float, divisor: int,
                 noise_multiplier: float, server_lr: float = 1.0, server_momentum: float = 0.0) -> None:
        if not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be > 0 for the known-rounds statistic, got {noise_multiplier!r}")
        if not clip_norm > 0 or divisor < 1 or not server_lr > 0 or not 0 <= server_momentum < 1:
            raise ValueError(f"clip_norm={clip_norm!r}, divisor={divisor!r}, server_lr={server_lr!r}, "
                             f"server_momentum={server_momentum!r}: out of range")
        self.canaries = canaries
        self.k = int(num_observed)
        self.clip_norm = float(clip_norm)
        self.divisor = int(divisor)
        self.z = float(noise_multiplier)
        self.eta = float(server_lr)
        self.beta = float(server_momentum)
        n = len(canaries)
        # running sums on the deltas' device (nothing is read back per round; the
        # host copies below are made at estimate time, :meth:`_host`)
        self._dev: dict[str, torch.Tensor] = {
            "sums": torch.zeros(n, dtype=torch.float64),  # sum of y_jt over canary j's rounds
            "counts": torch.zeros(n, dtype=torch.int64),  # r_j
            "un_squares": torch.zeros((), dtype=torch.float64),  # sum of y^2, unobserved rounds
            "momentum_sums": torch.zeros(self.k, dtype=torch.float64),  # A_j = sum_{t in R_j} beta^(T-t)
            "decay": torch.zeros((), dtype=torch.float64),  # B = sum_t beta^(T-t)
            "decay_squares": torch.zeros((), dtype=torch.float64),  # sum_t beta^(2 (T-t))
            "rounds": torch.zeros((), dtype=torch.int64),
            "skipped": torch.zeros((), dtype=torch.int64),
        }
        self._cache: dict[str, Any] | None = None  # the host copy, until the next round
        self._previous: torch.Tensor | None = None  # the previous delta (as given), when valid
        self._has_previous: torch.Tensor | None = None  # device bool: it is valid
        # <c_j, previous delta> [k + k'] float64, 0 where it is not valid; None: not computed yet
        self._previous_dots: torch.Tensor | None = None
        self._beta_on: torch.Tensor | None = None  # beta, float64 on the device
        self._auditor: CanaryScoreAuditor | None = None  # of the scores, until the next round

    # ------------------------------------------------------------------ host views
    def _host(self) -> dict[str, Any]:
        """The running sums on the host (numpy arrays, Python floats and ints): one read-back
        of the device state, cached until the next :meth:`update`."""
        if self._cache is None:
            d = {key: value.cpu() for key, value in self._dev.items()}
            self._cache = {
                "sums": d["sums"].numpy().copy(), "counts": d["counts"].numpy().copy(),
                "momentum_sums": d["momentum_sums"].numpy().copy(),
                "un_squares": float(d["un_squares"]), "decay": float(d["decay"]),
                "decay_squares": float(d["decay_squares"]), "rounds": int(d["rounds"]),
                "skipped": int(d["skipped"]),
            }
        return self._cache

    @property
    def sums(self) -> np.ndarray:
        """``[k + k']`` float64: the sum of ``y_jt`` over canary j's rounds (a host copy)."""
        return self._host()["sums"]

    @property
    def counts(self) -> np.ndarray:
        """``[k + k']`` int64: ``r_j``, the rounds folded with canary j (a host copy)."""
        return self._host()["counts"]

    @property
    def momentum_sums(self) -> np.ndarray:
        """``[k]`` float64: ``A_j`` (a host copy)."""
        return self._host()["momentum_sums"]

    @property
    def un_squares(self) -> float:
        return self._host()["un_squares"]

    @property
    def decay(self) -> float:
        return self._host()["decay"]

    @property
    def decay_squares(self) -> float:
        return self._host()["decay_squares"]

    @property
    def rounds(self) -> int:
        """Rounds folded (read back from the device)."""
        return self._host()["rounds"]

    @property
    def skipped(self) -> int:
        """Rounds not folded: a NaN or inf delta, or the round after one under momentum."""
        return self._host()["skipped"]

    # ------------------------------------------------------------------ updates
    def aggregate(self, model_delta: torch.Tensor) -> torch.Tensor:
        """The round's noisy average recovered from the model deltas (float64 ``[d]``)."""
        delta = model_delta.detach().to(torch.float64)
        prev = self._previous
        if prev is None or self.beta == 0:
            return delta / self.eta
        prev = prev.to(device=delta.device, dtype=torch.float64)
        if self._has_previous is not None:
            prev = torch.where(self._has_previous.to(delta.device), prev, 0.0)
        return (delta - self.beta * prev) / self.eta

    def fold(self, release: Release) -> torch.Tensor:
        """Fold one release: its model delta and participants (:meth:`update`), with the
        release's shared projection (its dot products and norm)."""
        p = release.projection
        return self.update(p.vector, release.participants, projection=(p.dots, p.norm))

    def update(self, model_delta: torch.Tensor, participants: np.ndarray | None, *,
               projection: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Fold one round: ``model_delta`` ``[d]`` (``theta_t - theta_{t-1}``) and the observed
        canaries that took part (local indices in ``[0, k)``, repeats allowed). A delta with NaN
        or inf is skipped (the next round's recovery then has no previous delta: with momentum
        it is skipped too; before any round is folded the first delta needs none). On the
        delta's device with no host synchronisation: the decision is a device bool that masks
        the round's contribution.

        One transform a round at most: the projections are linear, so ``<c_j, avg_t> = (<c_j,
        Delta_t> - beta <c_j, Delta_{t-1}>) / eta`` from this round's dot products and the
        previous round's (kept, ``[k + k']``), in float64 from float32 transforms (within float
        rounding of the transform of the recovered average: about 1e-7 of ``|Delta_t| +
        beta |Delta_{t-1}|`` in each dot product). ``model_delta`` is kept, not copied, as the
        previous delta of a checkpoint (:meth:`state_dict`) until the next round: the caller
        must not modify it (``FederatedRound``'s tensors are read-only to their readers).

        Args:
            model_delta: ``[d]`` floating, on any device.
            participants: ``[m]`` integer indices of the observed canaries in the round (None:
                none).
            projection: ``(dots, norm)`` of ``model_delta`` already computed (the all-iterates
                release's :class:`~audit_callbacks.canary.projection.Projection`):
                ``canaries.dots(model_delta)`` ``[k + k']`` float64 and its float64 L2 norm
                (0-dim); None: computed here.

        Returns:
            A 0-dim bool tensor on the delta's device: whether the round was folded.

        Raises:
            ValueError: a projection of the wrong shape; IndexError: a participant outside
            ``[0, k)``.
        """
        x = model_delta.detach()
        dev = self._to_device(x.device)
        if projection is None:
            dots = self.canaries.dots(x)
            norm = torch.linalg.vector_norm(x, dtype=torch.float64)
        else:
            dots, norm = projection
            if tuple(dots.shape) != (len(self.canaries),) or norm.dim() != 0:
                raise ValueError(f"projection: expected dots [{len(self.canaries)}] and a 0-dim norm, "
                                 f"got {tuple(dots.shape)} and {tuple(norm.shape)}")
        idx = _index_array(np.asarray([] if participants is None else participants), self.k, x.device)
        self._cache = None
        self._auditor = None
        # a float64 sum of float32 squares: finite iff every entry is; a norm is >= 0, +inf or
        # NaN, so "below inf" is isfinite in 1 operation (isfinite is 4)
        ok = norm < math.inf
        unit = self.divisor / (self.clip_norm * self.eta)  # y in units of one clipped update
        if self.beta > 0:
            assert self._has_previous is not None
            prev = self._previous_dots_on(x.device)  # 0 where the previous delta is not valid
            # the momentum can be undone with a valid previous delta (or before any round)
            fold = ok & (self._has_previous | (dev["rounds"] == 0))
            y = torch.add(dots, prev, alpha=-self.beta).nan_to_num_(0.0, 0.0, 0.0)
            # where(ok, dots, 0) in two fast passes (dots may hold NaN or inf when not ok)
            self._previous_dots = dots.nan_to_num(0.0, 0.0, 0.0).mul_(ok.to(torch.float64))
            self._previous = x
            self._has_previous = ok
        else:  # no momentum: no previous delta is kept
            fold = ok
            y = dots.nan_to_num(0.0, 0.0, 0.0)  # a new tensor: dots may be shared
        fold64 = fold.to(torch.float64)
        # = where(fold, y * unit, 0) in fast passes: a skipped round's y (NaN or inf) was made 0
        # above (0 * NaN is NaN); a folded round's y is finite, and 1.0 * unit is exactly unit
        y.mul_(fold64 * unit)
        take = fold.to(torch.int64)
        k = self.k
        dev["sums"].index_add_(0, idx, y.index_select(0, idx))
        dev["counts"].index_add_(0, idx, take.expand(idx.numel()))
        un = y[k:]
        dev["sums"][k:].add_(un)  # in place on the view (``x[k:] += un`` copies it back onto itself)
        dev["counts"][k:].add_(take)
        dev["un_squares"] += torch.dot(un, un)
        factor = torch.where(fold, self._beta_on, 1.0)  # beta in float64, not a float32 scalar
        dev["momentum_sums"].mul_(factor).index_add_(0, idx, fold64.expand(idx.numel()))
        dev["decay"].mul_(factor).add_(fold64)
        dev["decay_squares"].mul_(factor * factor).add_(fold64)
        dev["rounds"] += take
        dev["skipped"] += 1 - take
        return fold

    def _previous_dots_on(self, device: torch.device) -> torch.Tensor:
        """``<c_j, previous delta>`` ``[k + k']`` float64 on ``device``, 0 where the previous
        delta is not valid (computed once after a restore)."""
        if self._previous_dots is None:
            n = len(self.canaries)
            if self._previous is None:
                self._previous_dots = torch.zeros(n, dtype=torch.float64, device=device)
            else:
                assert self._has_previous is not None
                prev = self._previous.to(device)
                self._previous_dots = torch.where(self._has_previous, self.canaries.dots(prev), 0.0)
        elif self._previous_dots.device != device:
            self._previous_dots = self._previous_dots.to(device)
        return self._previous_dots

    def _to_device(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The running sums, moved to ``device`` (the deltas') on first use."""
        dev = self._dev
        if dev["sums"].device != device:
            for key in dev:
                dev[key] = dev[key].to(device)
            if self._previous is not None:
                self._previous = self._previous.to(device)
        if self._beta_on is None or self._beta_on.device != device:
            self._beta_on = torch.tensor(self.beta, dtype=torch.float64, device=device)
        if self._has_previous is None or self._has_previous.device != device:
            has = False if self._has_previous is None else bool(self._has_previous)
            self._has_previous = torch.tensor(has and self._previous is not None, device=device)
        return dev

    def restart(self) -> None:
        """The server optimizer restarts with an empty momentum buffer (a new ``fit`` builds a
        new one in ``configure_optimizers``): its first delta is ``eta avg_t`` with nothing to
        undo, so the previous delta is zero (a checkpoint's state, restored after this, puts
        the saved one back together with the optimizer's buffer)."""
        device = self._dev["sums"].device
        self._previous = torch.zeros(self.canaries.dim, dtype=torch.float64, device=device)
        self._previous_dots = torch.zeros(len(self.canaries), dtype=torch.float64, device=device)
        self._has_previous = torch.ones((), dtype=torch.bool, device=device)

    # ------------------------------------------------------------------ scores
    #: Bootstrap draws (resamples x unobserved canaries) up to which the unobserved canaries
    #: are resampled index by index (the draws of a per-resample loop, bit for bit);
    #: above it their resampled mean is drawn from its normal limit (:meth:`estimate`).
    exact_bootstrap_draws = 1 << 22

    def scores(self) -> tuple[np.ndarray, np.ndarray]:
        """``(observed, unobserved)``: ``t_j`` of the observed canaries that took part
        ``[<= k]`` and of the unobserved ones ``[k']`` (empty before any round)."""
        took = self.counts[: self.k] > 0
        obs = self.sums[: self.k][took] / (self.z * np.sqrt(self.counts[: self.k][took]))
        un_counts = self.counts[self.k:]
        unobs = self.sums[self.k:] / (self.z * np.sqrt(np.maximum(un_counts, 1))) if self.rounds else self.sums[:0]
        return obs, unobs

    def score_auditor(self) -> CanaryScoreAuditor:
        """The one :class:`~audit_callbacks.estimators.CanaryScoreAuditor` of :meth:`scores`
        (kept until the next round), read by the report's bounds. ValueError when the scores
        cannot be audited (fewer than 2, all equal)."""
        if self._auditor is None:
            self._auditor = CanaryScoreAuditor(*self.scores())
        return self._auditor

    def last_iterate(self, delta: float) -> float | None:
        """The last-iterate heuristic of the observed canaries (:meth:`last_iterate_shifts`
        with the server's momentum weights), None before a round is folded."""
        if self.rounds == 0:
            return None
        from audit_callbacks.estimators.last_iterate import fedavg_last_iterate_epsilon

        return fedavg_last_iterate_epsilon(self.last_iterate_shifts(), delta)

    def _pooled_sd(self) -> float:
        """The sd of ``y`` over every unobserved (canary, round): the resamples keep it."""
        k = self.k
        r_out = self.counts[k:].sum()
        var_out = self.un_squares / r_out - (self.sums[k:].sum() / r_out) ** 2
        return math.sqrt(max(var_out, 1e-300))

    def per_round_shift(self, obs_idx: np.ndarray | None = None, un_idx: np.ndarray | None = None) -> float:
        """``mu_1``: the per-participation shift of ``y`` in noise standard deviations, from the
        observed canaries ``obs_idx`` (default: all) and the unobserved ``un_idx`` (default: all;
        the sd is always the pooled one of every unobserved round).

        Raises:
            ValueError: fewer than 1 participation of the observed canaries or 2 unobserved
            rounds.
        """
        k = self.k
        counts, sums = self.counts, self.sums
        # slices for the defaults: the same numbers, summed in the same order, as gathers
        o_counts, o_sums = (counts[:k], sums[:k]) if obs_idx is None else (counts[obs_idx], sums[obs_idx])
        u_counts, u_sums = (counts[k:], sums[k:]) if un_idx is None else (counts[k + un_idx], sums[k + un_idx])
        r_in = o_counts.sum()
        r_out = u_counts.sum()
        if r_in < 1 or r_out < 2:
            raise ValueError("too few participations for the known-rounds estimate")
        mean_in = o_sums.sum() / r_in
        mean_out = u_sums.sum() / r_out
        return (mean_in - mean_out) / self._pooled_sd()

    def _bootstrap_shifts(self, bootstrap: int, seed: int) -> np.ndarray:
        """``[bootstrap]`` resampled ``mu_1`` (observed canaries that took part and unobserved
        canaries, each resampled with replacement; the pooled sd kept).

        Up to :attr:`exact_bootstrap_draws` draws: the per-resample loop (per
        resample ``rng.choice`` of the observed, then ``rng.integers`` of the unobserved
        indices), its draws and its values bit for bit, without its recomputations. Above it
        (k' = 100,000 and 200 resamples is 20M draws, ~50 ms on one core): the observed
        canaries are resampled in blocks, and the resampled unobserved mean ``sum_u sums_u /
        sum_u counts_u`` is drawn from its normal limit ``N(mean_out, se^2)``, ``se^2 =
        mean_j (sums_j - mean_out counts_j)^2 / (k' mean_j(counts_j)^2)`` (the delta method of
        the ratio; with the equal counts of unobserved canaries, exactly the variance of a
        resampled mean). Its share of the interval is about ``P_in / (k' T)`` of the variance
        (P_in participations against k' T unobserved rounds), and at k' above ~20,000 the
        normal limit's error is below 1% of that share (Berry-Esseen); the coverage is checked
        against the index-by-index bootstrap in tests/estimators/test_estimate_round2_equivalence.py.
        """
        k = self.k
        counts, sums = self.counts, self.sums
        rng = np.random.default_rng([int(seed), 0xB007])
        took = np.flatnonzero(counts[:k] > 0)
        n_un = len(sums) - k
        sd = self._pooled_sd()
        un_counts, un_sums = counts[k:], sums[k:]
        if bootstrap * n_un <= self.exact_bootstrap_draws:
            equal = int(un_counts.min()) == int(un_counts.max())
            mus = np.empty(bootstrap)
            for b in range(bootstrap):
                o = rng.choice(took, size=took.size)
                u = rng.integers(0, n_un, size=n_un)
                r_in = counts[o].sum()
                r_out = n_un * int(un_counts[0]) if equal else un_counts[u].sum()
                if r_in < 1 or r_out < 2:
                    raise ValueError("too few participations for the known-rounds estimate")
                mus[b] = (sums[o].sum() / r_in - un_sums[u].sum() / r_out) / sd
            return mus
        rows = max(1, (1 << 20) // max(took.size, 1))  # blocks of about 1M indices
        parts = []
        for start in range(0, bootstrap, rows):
            o = took[rng.integers(0, took.size, size=(min(rows, bootstrap - start), took.size))]
            parts.append(sums[o].sum(axis=1) / counts[o].sum(axis=1))
        mean_in = np.concatenate(parts)
        r_out = un_counts.sum()
        mean_out = un_sums.sum() / r_out
        c_bar = r_out / n_un
        resid = un_sums - mean_out * un_counts
        se = math.sqrt(float(np.dot(resid, resid)) / n_un / n_un) / c_bar
        return (mean_in - (mean_out + se * rng.standard_normal(bootstrap))) / sd

    def estimate(self, delta: float, *, alpha: float = 0.05, bootstrap: int = 0, seed: int = 0) -> AuditResult:
        """The all-iterates estimate: ``epsilon_GDP(sqrt(r_max) mu_1, delta)`` (module
        docstring), with a percentile bootstrap over canaries (``bootstrap`` resamples, level
        1 - alpha; :meth:`_bootstrap_shifts`).

        Args:
            delta: in (0, 1).
            alpha: in (0, 1), 1 - the interval's level.
            bootstrap: B >= 0 resamples (0: no interval).
            seed: non-negative seed of the resampling.

        Returns:
            AuditResult: value = epsilon (nats), lower/upper (bootstrap), counts and details
            (per_round_mu, mu, mu_analytic_per_round, threat_model).

        Raises:
            ValueError: bad delta, alpha, bootstrap or seed (named); no participation yet, or
            fewer than 2 unobserved canaries.
        """
        d = check_delta(delta)
        a = check_alpha(alpha)
        b = check_count(bootstrap, "bootstrap")
        s = check_seed(seed)
        k = self.k
        if len(self.sums) - k < 2:
            raise ValueError("the known-rounds estimate needs unobserved canaries (num_unobserved >= 2)")
        r_max = int(self.counts[:k].max(initial=0))
        mu1 = self.per_round_shift()
        root = math.sqrt(r_max)
        value = float(gaussian_epsilon_array(np.array([max(root * mu1, 0.0)]), d)[0])
        lower = upper = None
        if b > 0:
            eps = gaussian_epsilon_array(np.maximum(root * self._bootstrap_shifts(b, s), 0.0), d)
            lower, upper = (float(v) for v in np.quantile(eps, [a / 2, 1 - a / 2]))
        return AuditResult(
            value=float(value), lower=lower, upper=upper,
            alpha=a if b > 0 else None, delta=d, method="known_rounds_aligned_sum",
            source=SOURCE,
            counts={"participations": int(self.counts[:k].sum()), "max_participations": r_max,
                    "rounds": self.rounds, "rounds_skipped": self.skipped},
            details={"per_round_mu": float(mu1), "mu": float(math.sqrt(r_max) * mu1),
                     "mu_analytic_per_round": 1.0 / self.z, "threat_model": "all_iterates"},
        )

    def last_iterate_shifts(self) -> np.ndarray:
        """``mu_j`` of the observed canaries that took part (module docstring): the last
        iterate's Gaussian shift of each canary, in units of the noise."""
        took = self.counts[: self.k] > 0
        b = self.beta
        r = self.counts[: self.k][took].astype(np.float64)
        a = self.momentum_sums[took]
        # sum_{t in R_j} w_t with w_t = (1 - b^(T-t+1)) / (1 - b): (r_j - b A_j) / (1 - b)
        weight_sums = r if b == 0 else (r - b * a) / (1.0 - b)
        # sum_t w_t^2 = sum_t (1 - 2 b^(T-t+1) + b^(2(T-t+1))) / (1 - b)^2
        total = self.rounds if b == 0 else (
            self.rounds - 2 * b * self.decay + b * b * self.decay_squares) / (1.0 - b) ** 2
        return weight_sums / (self.z * math.sqrt(max(total, 1e-300)))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The running sums, on the CPU (the keys and types of the host-side version before
        the running sums kept on the device, so checkpoints load either way)."""
        h = self._host()
        valid = self._previous is not None and (self._has_previous is None or bool(self._has_previous))
        return {"sums": torch.from_numpy(h["sums"].copy()), "counts": torch.from_numpy(h["counts"].copy()),
                "un_squares": h["un_squares"],
                "momentum_sums": torch.from_numpy(h["momentum_sums"].copy()), "decay": h["decay"],
                "decay_squares": h["decay_squares"], "rounds": h["rounds"], "skipped": h["skipped"],
                "previous": (self._previous.detach().to(device="cpu", dtype=torch.float64, copy=True)
                             if valid and self._previous is not None else None),
                **self._mechanism()}

    def _mechanism(self) -> dict[str, float]:
        """The release's settings the sums are in units of (a resume must not change them)."""
        return {"noise_multiplier": self.z, "clip_norm": self.clip_norm, "divisor": self.divisor,
                "server_lr": self.eta, "server_momentum": self.beta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            ValueError: a field of the wrong shape, or the checkpoint's release settings
                (noise_multiplier, clip_norm, divisor: the expected cohort, server_lr,
                server_momentum) differ from this run's: its sums are in units of its own
                clipped update and noise, and its rounds compose at its own noise; the message
                names the setting. A checkpoint written before these were saved is not checked.
        """
        for key, value in self._mechanism().items():
            if key in state and not math.isclose(float(state[key]), value, rel_tol=1e-12, abs_tol=0.0):
                raise ValueError(f"the checkpoint's canary audit ran at {key}={state[key]!r}, this run at "
                                 f"{key}={value!r}: its statistics and the claim's rounds are at its own "
                                 f"setting, so they cannot continue at another (start a new audit, or resume "
                                 f"with {key}={state[key]!r})")
        dev = self._dev
        device = dev["sums"].device
        for key in ("sums", "counts", "momentum_sums"):
            value = state[key]
            arr = torch.as_tensor(value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value))
            if tuple(arr.shape) != tuple(dev[key].shape):
                raise ValueError(f"known-rounds state: {key} has shape {tuple(arr.shape)}, expected "
                                 f"{tuple(dev[key].shape)}")
            dev[key] = arr.to(device=device, dtype=dev[key].dtype).clone()
        for key in ("un_squares", "decay", "decay_squares", "rounds", "skipped"):
            dev[key] = torch.tensor(state[key], dtype=dev[key].dtype, device=device)
        self._cache = None
        self._auditor = None
        prev = state.get("previous")
        self._previous = None if prev is None else torch.as_tensor(prev, dtype=torch.float64).to(device).clone()
        self._previous_dots = None  # <c_j, previous> at the next update
        self._has_previous = torch.tensor(prev is not None, device=device)
