"""Issue 28 item 3 (estimates cheap at k' = 100,000): every number of a canary report is the one
the code before these changes gives (kept below verbatim as references).

What changed, and what each test here holds it to:

* ``one_run.fdp_rejects`` steps the f-DP recursion without masks (lanes ordered by v, a lane
  that stops moving is left exactly as it is): its answers are bit for bit those of the masked
  recursion (``_fdp_rejects_before``), on random lanes and on edge lanes.
* ``valid_bounds.tightest_valid_lower_bounds`` computes several valid bounds with one f-DP
  search: each result equals (``==``, value and details) the single
  ``tightest_valid_lower_bound`` / ``watched_lower_bound`` call.
* ``canary_estimates`` asks for both threat models' valid bounds at once, reuses its auditors
  (no re-sorting) and draws the bootstrap resamples of the final-model and max-cosine
  estimates once (``canary_epsilon.share_resamples``); ``score_auditor._nct_lower`` calls
  ``scipy.special.nctdtr`` (what ``stats.nct.cdf`` evaluates). The whole report equals the
  report of the code before (``_canary_report_before`` with the previous ``fdp_rejects``,
  ``_nct_lower`` and resampling patched in): every value, status and detail identical, the
  bootstrap interval ends within 1e-12 relative (the sums of squares of the resamples are
  reduced in blocks of other shapes; the draws are the same).
* ``_nct_lower`` no longer fails where scipy's noncentral-t cdf is NaN far in its tails (the
  GDP bound was lost at a logged point's small level): the root is the exact one there, and
  where the cdf is a number the bound is the same as before.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import brentq
from scipy.special import nctdtr, ndtr, ndtri

from audit_callbacks.estimators import canary_epsilon, one_run, score_auditor
from audit_callbacks.estimators.canary_report import (
    BOUND_METHODS,
    canary_estimates,
    estimate_names,
)
from audit_callbacks.estimators.one_run import fdp_mu, fdp_rejects, guess_counts
from audit_callbacks.estimators.result import AuditResult
from audit_callbacks.estimators.score_auditor import CanaryScoreAuditor, _nct_lower
from audit_callbacks.estimators.valid_bounds import (
    spent_alpha,
    tightest_valid_lower_bound,
    tightest_valid_lower_bounds,
    watched_lower_bound,
)

# ------------------------------------------------------------------- references (verbatim)


def _fdp_rejects_before(mu, n, v, m, level):
    """``one_run.fdp_rejects`` before this change (verbatim)."""
    r, h = _fdp_recursion_before(mu, n, v, m, level)
    return r + h > n / m


def _fdp_recursion_before(mu, n, v, m, level):
    """The recursion of ``_fdp_rejects_before`` (verbatim but for returning its final r, h)."""
    r, h, i = level * v / m, level * (n - v) / m, (v - 1).astype(float)
    live = np.flatnonzero(v > 0)
    rr, hh, ii, mm, nn = r[live], h[live], i[live], mu[live], n[live].astype(float)
    step = 0
    while live.size:
        g = ndtri(rr)
        g -= mm
        ndtr(g, out=g)
        moved = g > hh
        moved &= ii >= 0
        d = g - hh  # r <- min(r + i/(n - i) (h' - h), 1), h <- h' = g where moved
        d *= ii / np.maximum(nn - ii, 1.0)
        d += rr
        np.minimum(d, 1.0, out=d)
        np.copyto(rr, d, where=moved)
        np.copyto(hh, g, where=moved)
        ii -= 1.0
        step += 1
        if step % 16 == 0 or not moved.any():
            r[live], h[live] = rr, hh
            live, rr, hh, ii, mm, nn = (a[moved] for a in (live, rr, hh, ii, mm, nn))
    return r, h


def _nct_lower_before(t_obs: float, df: int, alpha: float) -> float:
    """``score_auditor._nct_lower`` before this change (verbatim)."""
    if not math.isfinite(float(ndtri(1.0 - alpha))):
        return -math.inf

    def f(lam: float) -> float:
        return float(stats.nct.cdf(t_obs, df, lam)) - (1.0 - alpha)

    z = float(ndtri(1.0 - alpha))
    spread = z * math.sqrt(1.0 + t_obs * t_obs / (2.0 * df)) + 1.0
    lo, hi = t_obs - 2.0 * spread - 1.0, t_obs + 1.0
    while f(lo) <= 0.0:  # cdf decreases in lambda: f(lo) > 0 > f(hi) brackets the root
        lo -= 2.0 * spread + 1.0
    while f(hi) >= 0.0:
        hi += spread
    return float(brentq(f, lo, hi, xtol=1e-10, rtol=1e-12))


def _resampled_mean_sd_before(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``canary_epsilon._resampled_mean_sd`` before this change (verbatim)."""
    n = idx.shape[1]
    centre = float(x.mean())
    c = x - centre
    s = c[idx]
    total = s.sum(axis=1)
    squares = np.einsum("ij,ij->i", s, s)
    sd = np.sqrt(np.maximum(squares - total * total / n, 0.0) / (n - 1))
    small = np.flatnonzero(sd <= 1e-6 * np.max(np.abs(c)))
    if small.size:
        sd[small] = x[idx[small]].std(axis=1, ddof=1)
    return centre + total / n, sd


_LAST_BEFORE: dict[bytes, tuple[np.ndarray, ...]] = {}
_LOCK_BEFORE = threading.Lock()


def _resample_key(obs: np.ndarray, unobs: np.ndarray | None, b: int, seed: int) -> bytes:
    h = hashlib.blake2b(digest_size=20)
    h.update(np.asarray([obs.size, -1 if unobs is None else unobs.size, b, seed], dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(obs, dtype=np.float64).tobytes())
    if unobs is not None:
        h.update(np.ascontiguousarray(unobs, dtype=np.float64).tobytes())
    return h.digest()


def _resample_moments_before(obs, unobs, b, seed):
    """``canary_epsilon._resample_moments`` before this change (verbatim, its own memo)."""
    key = _resample_key(obs, unobs, b, seed)
    with _LOCK_BEFORE:
        hit = _LAST_BEFORE.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    rng = np.random.default_rng(seed)
    k = obs.size
    kk = 0 if unobs is None else unobs.size
    chunk = max(1, int(2_000_000 // max(k + kk, 1)))
    parts: list[tuple[np.ndarray, ...]] = []
    done = 0
    while done < b:
        n = min(chunk, b - done)
        mu1, s1 = _resampled_mean_sd_before(obs, rng.integers(0, k, size=(n, k)))
        if unobs is None:
            parts.append((mu1, s1))
        else:
            parts.append((mu1, s1, *_resampled_mean_sd_before(unobs, rng.integers(0, kk, size=(n, kk)))))
        done += n
    out = tuple(np.concatenate(col) for col in zip(*parts, strict=True))
    if unobs is None:
        out = (*out, None, None)
    for arr in out:
        if arr is not None:
            arr.flags.writeable = False  # shared with the next caller of the same inputs
    with _LOCK_BEFORE:
        _LAST_BEFORE.clear()
        _LAST_BEFORE[key] = out
    return out  # type: ignore[return-value]


Scores = tuple[np.ndarray, np.ndarray]


def _valid_bound_before(scores: list[Scores], delta: float, alpha: float, index: int | None,
                        seed: int) -> AuditResult:
    """``canary_report._valid_bound`` before this change (verbatim)."""
    share = alpha / len(scores)
    best: AuditResult | None = None
    values = []
    for i, (ins, outs) in enumerate(scores):
        if index is None:
            res = tightest_valid_lower_bound(ins, outs, alpha=share, delta=delta, seed=seed + i,
                                             methods=BOUND_METHODS)
        else:
            res = watched_lower_bound(ins, outs, alpha=share, delta=delta, index=index,
                                      seed=seed + i, methods=BOUND_METHODS)
        values.append(res.value)
        if best is None or res.value > best.value:
            best = res
    assert best is not None
    if len(scores) == 1:
        return best
    return replace(best, alpha=alpha, details={**best.details, "statistic_values": values,
                                               "alpha_per_statistic": share})


def _canary_report_before(
    final: Scores, delta: float, *, max_cosine: Scores | None = None,
    matched: tuple[Scores, AuditResult] | None = None, dim: int | None = None,
    alpha: float = 0.05, bootstrap: int = 0, seed: int = 0, index: int | None = None,
    gof_level: float = 0.01,
) -> tuple[dict[str, AuditResult], dict[str, str]]:
    """``canary_estimates`` before this change (verbatim body)."""
    _valid_bound = _valid_bound_before
    estimates: dict[str, AuditResult] = {}
    skipped: dict[str, str] = {}

    def attempt(name: str, call: Callable[[], AuditResult]) -> AuditResult | None:
        try:
            res = call()
        except ValueError as err:  # degenerate scores: say why, never a NaN
            skipped[name] = str(err)
            return None
        if res.status != "ok" and name.startswith("epsilon_gdp"):
            skipped[name] = res.status
            return None
        estimates[name] = res
        return res

    few = "fewer than 2 observed or unobserved canaries (or no round yet)"
    fin = estimate_names("final_model")
    allit = estimate_names("all_iterates")
    final_ok = np.size(final[0]) >= 2 and np.size(final[1]) >= 2
    if not final_ok:
        skipped.update({n: few for n in (*fin.values(), *allit.values())})
        return estimates, skipped
    fa = CanaryScoreAuditor(final[0], final[1], dim=dim)
    est = dict(delta=delta, bootstrap=bootstrap, confidence=1 - alpha, seed=seed)
    final_est = attempt(fin["estimate"], lambda: fa.epsilon_estimate(fit="equal", **est))
    attempt(fin["unequal_fit"], lambda: fa.epsilon_estimate(fit="unequal", **est))
    attempt(fin["lower_bound"], lambda: _valid_bound([final], delta, alpha, index, seed))
    gdp_alpha = alpha if index is None else spent_alpha(alpha, index)  # a logged series, too
    attempt(fin["gdp_lower_bound"], lambda: fa.epsilon_gdp_lower_bound(gdp_alpha, delta, gof_level=gof_level))

    cos_ok = max_cosine is not None and np.size(max_cosine[0]) >= 2 and np.size(max_cosine[1]) >= 2
    if cos_ok:
        assert max_cosine is not None
        ca = CanaryScoreAuditor(max_cosine[0], max_cosine[1])
        attempt(allit["max_cosine"], lambda: ca.epsilon_estimate(fit="equal", **est))
    else:
        skipped[allit["max_cosine"]] = few
    pool: list[Scores] = [final]
    matched_est = None
    if matched is None:
        skipped[allit["matched"]] = "no statistic matched to the analytic epsilon's adversary here"
        gdp_scores = max_cosine if cos_ok else None
        if cos_ok:
            assert max_cosine is not None
            pool.insert(0, max_cosine)
    else:
        (m_in, m_out), m_est = matched
        estimates[allit["matched"]] = matched_est = m_est
        pool = [(m_in, m_out)]
        gdp_scores = (m_in, m_out)
    options = [r for r in (matched_est, estimates.get(allit["max_cosine"]) if matched is None else None,
                           final_est) if r is not None]
    if options:
        best = max(options, key=lambda r: r.value)
        winner = "final_model" if best is final_est else (
            "matched" if best is matched_est else "max_cosine")
        estimates[allit["estimate"]] = replace(best, details={
            **best.details, "statistic": winner,
            "candidates": {"matched": None if matched_est is None else matched_est.value,
                           "final_model": None if final_est is None else final_est.value}})
    else:
        skipped[allit["estimate"]] = skipped.get(fin["estimate"], few)
    attempt(allit["lower_bound"], lambda: _valid_bound(pool, delta, alpha, index, seed))
    if gdp_scores is not None and np.size(gdp_scores[0]) >= 2 and np.size(gdp_scores[1]) >= 2:
        ga = CanaryScoreAuditor(gdp_scores[0], gdp_scores[1])
        attempt(allit["gdp_lower_bound"], lambda: ga.epsilon_gdp_lower_bound(gdp_alpha, delta, gof_level=gof_level))
    else:
        skipped[allit["gdp_lower_bound"]] = few
    return estimates, skipped


def _report_before(monkeypatch: pytest.MonkeyPatch, *args, **kwargs):
    """The report of the code before: the previous recursion, cdf calls and resampling."""
    with monkeypatch.context() as mp:
        mp.setattr(one_run, "fdp_rejects", _fdp_rejects_before)
        mp.setattr(score_auditor, "_nct_lower", _nct_lower_before)
        mp.setattr(canary_epsilon, "_resample_moments", _resample_moments_before)
        _LAST_BEFORE.clear()
        return _canary_report_before(*args, **kwargs)


# ------------------------------------------------------------------------------- f-DP


def _lanes(count: int, seed: int) -> tuple[np.ndarray, ...]:
    """Candidate rules of ``count`` simulated pools of 8..2000 canaries (ties, no effect,
    large effects), each lane at a level in [1e-5, 0.3]."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(count):
        m = int(rng.integers(8, 2000))
        k = int(rng.integers(1, m))
        x = rng.normal(rng.uniform(0.0, 5.0), 1.0, k)
        y = rng.normal(0.0, 1.0, m - k)
        if d % 3 == 0:
            x, y = np.round(x), np.round(y)
        n, v, _, _ = guess_counts(x, y, d)
        out.append((n, v, np.full(n.size, float(m)), 10.0 ** rng.uniform(-5.0, math.log10(0.3), n.size)))
    return tuple(np.concatenate(a) for a in zip(*out, strict=True))


def test_fdp_rejects_answers_are_those_of_the_masked_recursion() -> None:
    n, v, m, level = _lanes(25, seed=1)
    ref_mu = fdp_mu(n, v, m, level)
    rng = np.random.default_rng(2)
    for mu in (np.zeros(n.size), ref_mu, np.nextafter(ref_mu, np.inf), ref_mu + 1e-6,
               ref_mu * 0.97, ref_mu * 1.05 + 0.01, rng.uniform(0.0, 8.0, n.size),
               np.full(n.size, one_run.MU_MAX)):
        new = fdp_rejects(mu, n, v, m, level)
        old = _fdp_rejects_before(mu.copy(), n, v, m, level)
        assert np.array_equal(new, old)
        for a, b in zip(one_run._fdp_recursion(mu, n, v, m, level),
                        _fdp_recursion_before(mu.copy(), n, v, m, level), strict=True):
            assert np.array_equal(a, b)  # the recursion's final r and h, bit for bit
    # both answers occur near each lane's threshold
    assert fdp_rejects(ref_mu, n, v, m, level)[ref_mu > 0].all()
    assert not fdp_rejects(ref_mu + 1e-6, n, v, m, level)[ref_mu > 0].any()


def test_fdp_rejects_edge_lanes() -> None:
    # v = 0, v = n, n = m, one guess, level near 1 (r reaches its cap 1), v at the ends of
    # the 16-step chunks, mu = 0 / huge / NaN
    n = np.array([5, 5, 40, 40, 1, 1, 300, 300, 7, 7, 2000, 3, 16, 17, 33, 48, 64, 64])
    v = np.array([0, 5, 40, 39, 1, 0, 300, 150, 7, 6, 1999, 3, 16, 17, 32, 33, 48, 64])
    m = np.array([10.0, 10, 40, 80, 2, 2, 300, 600, 7, 50, 2000, 3, 16, 17, 33, 48, 64, 64])
    level = np.array([0.05, 0.05, 0.3, 1e-9, 0.5, 0.5, 0.999, 0.01, 0.2, 0.05, 1e-4, 0.9,
                      0.9, 0.99, 0.5, 0.3, 0.7, 0.999])
    for mu in (np.zeros(n.size), np.full(n.size, 0.5), np.full(n.size, 3.0),
               np.full(n.size, 40.0), np.linspace(0.0, 12.0, n.size),
               np.where(np.arange(n.size) % 2 == 0, np.nan, 1.0)):
        assert np.array_equal(fdp_rejects(mu, n, v, m, level),
                              _fdp_rejects_before(mu.copy(), n, v, m, level))
        for a, b in zip(one_run._fdp_recursion(mu, n, v, m, level),
                        _fdp_recursion_before(mu.copy(), n, v, m, level), strict=True):
            assert np.array_equal(a, b, equal_nan=True)


def test_fdp_mu_with_groups_keeps_each_groups_maximum_at_report_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # three pools of 1,867 canaries (k = 1000, k' = 100,000 emulated pools), as a report asks
    rng = np.random.default_rng(4)
    lanes, groups = [], []
    for g, effect in enumerate((0.0, 1.5, 4.0)):
        x, y = rng.normal(effect, 1.0, 930), rng.normal(0.0, 1.0, 937)
        n, v, _, _ = guess_counts(x, y, g)
        lanes.append((n, v, np.full(n.size, 1867.0), np.full(n.size, 0.025 / n.size)))
        groups.append(np.full(n.size, g))
    n, v, m, lv = (np.concatenate(a) for a in zip(*lanes, strict=True))
    own = np.concatenate(groups)
    new = fdp_mu(n, v, m, lv, groups=own)
    monkeypatch.setattr(one_run, "fdp_rejects", _fdp_rejects_before)
    old = fdp_mu(n, v, m, lv, groups=own)
    assert np.array_equal(new, old)
    assert old[own == 2].max() > old[own == 1].max() > 0.0


# ----------------------------------------------------------------------- valid bounds


def _sets(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(2.0, 1.0, 300), rng.normal(0.0, 1.0, 7892)),
        (rng.normal(0.0, 1.0, 50), rng.normal(0.0, 1.0, 60)),  # no effect
        (np.round(rng.normal(1.0, 1.0, 200)), np.round(rng.normal(0.0, 1.0, 400))),  # ties
        (rng.normal(4.0, 1.0, 30), rng.normal(0.0, 1.0, 3000)),
    ]


@pytest.mark.parametrize("index", [None, 1, 4])
def test_tightest_valid_lower_bounds_equal_the_single_calls(index: int | None) -> None:
    sets = _sets(5)
    alphas = [0.05, 0.025, 0.025, 0.01]
    seeds = [0, 3, 1, 7]
    kw = dict(delta=1e-5, methods=BOUND_METHODS)
    together = tightest_valid_lower_bounds(sets, alphas=alphas, seeds=seeds, index=index, **kw)
    for (x, y), a, s, got in zip(sets, alphas, seeds, together, strict=True):
        if index is None:
            alone = tightest_valid_lower_bound(x, y, alpha=a, seed=s, **kw)
        else:
            alone = watched_lower_bound(x, y, alpha=a, seed=s, index=index, **kw)
        assert got == alone  # value, alpha, counts, details: every field
    assert together[0].value > 0 and together[3].value > together[1].value


def test_tightest_valid_lower_bounds_all_methods_and_auditors() -> None:
    sets = _sets(6)
    auds = [CanaryScoreAuditor(x, y) for x, y in sets]
    got = tightest_valid_lower_bounds(auds, alphas=[0.05] * 4, seeds=[2] * 4, delta=1e-6)
    for (x, y), r in zip(sets, got, strict=True):
        assert r == tightest_valid_lower_bound(x, y, alpha=0.05, delta=1e-6, seed=2)


def test_tightest_valid_lower_bounds_bad_input() -> None:
    x, y = _sets(7)[0]
    kw = dict(delta=1e-5)
    assert tightest_valid_lower_bounds([], alphas=[], seeds=[], **kw) == []
    with pytest.raises(ValueError, match="alphas and seeds"):
        tightest_valid_lower_bounds([(x, y)], alphas=[0.05, 0.05], seeds=[0], **kw)
    with pytest.raises(ValueError, match="delta"):
        tightest_valid_lower_bounds([], alphas=[], seeds=[], delta=2.0)  # arguments first
    with pytest.raises(ValueError, match="alpha"):
        tightest_valid_lower_bounds([(x, y)], alphas=[1.5], seeds=[0], **kw)
    with pytest.raises(ValueError, match="seed"):
        tightest_valid_lower_bounds([(x, y)], alphas=[0.05], seeds=[-1], **kw)
    with pytest.raises(ValueError, match="index"):
        tightest_valid_lower_bounds([(x, y)], alphas=[0.05], seeds=[0], index=0, **kw)
    with pytest.raises(ValueError, match="dim"):
        tightest_valid_lower_bounds([CanaryScoreAuditor(x / 100, y / 100, dim=10_000)],
                                    alphas=[0.05], seeds=[0], **kw)
    with pytest.raises(ValueError, match="in_scores"):
        tightest_valid_lower_bounds([(np.ones(5), y)], alphas=[0.05], seeds=[0], **kw)


# --------------------------------------------------------------------- whole reports


def _scores(k: int, kk: int, seed: int, shift: float = 3.0) -> tuple[Scores, Scores]:
    """Final-model cosines and max cosines of a Hadamard-canary audit (sd 1e-2)."""
    rng = np.random.default_rng(seed)
    s = 0.01
    final = (rng.normal(shift * s, s, k), rng.normal(0.0, s, kk))
    maxc = (rng.normal((shift + 1.0) * s, s, k) + 0.03, rng.normal(0.0, s, kk) + 0.03)
    return final, maxc


def _as_before(res: AuditResult) -> AuditResult:
    """``res`` without what later changes added on purpose: the ``alpha`` of a two-Gaussian
    estimate's bootstrap interval (1 - its confidence; None before) and the headline's
    ``candidates`` (checked apart: :func:`_same_candidates`)."""
    fitted = str(res.method).startswith("two_gaussians")
    return replace(res, alpha=None if fitted else res.alpha,
                   details={k: v for k, v in res.details.items() if k != "candidates"})


def _same_candidates(a: AuditResult, b: AuditResult) -> None:
    """The headline's candidates: the same final-model and matched values as before; the
    max cosine, a candidate where no matched statistic exists, is now named among them."""
    new, old = a.details.get("candidates"), b.details.get("candidates")
    assert (new is None) == (old is None)
    if new is not None:
        assert new["final_model"] == old["final_model"]
        assert new.get("matched") == old["matched"]
        assert ("max_cosine" in new) == (old["matched"] is None)


def _assert_same_report(new: tuple[dict, dict], old: tuple[dict, dict]) -> None:
    (est_n, skip_n), (est_o, skip_o) = new, old
    assert skip_n == skip_o
    assert list(est_n) == list(est_o)  # the same names, in the same order
    for name, a in est_n.items():
        b = est_o[name]
        _same_candidates(a, b)
        a, b = _as_before(a), _as_before(b)
        assert math.isfinite(a.value)
        if a.lower is None:
            assert a == b, name
        else:  # the bootstrap interval: the same draws, sums reduced in other blocks
            assert replace(a, lower=None, upper=None) == replace(b, lower=None, upper=None), name
            assert a.lower == pytest.approx(b.lower, rel=1e-12, abs=1e-300)
            assert a.upper == pytest.approx(b.upper, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(
    "k, kk, index, bootstrap, shift",
    [(300, 7892, None, 0, 3.0), (300, 7892, 3, 0, 3.0), (300, 7892, None, 60, 3.0),
     (40, 500, 2, 30, 0.0), (200, 4000, 1, 0, 8.0)],
)
def test_report_equals_the_report_before(monkeypatch, k, kk, index, bootstrap, shift) -> None:
    final, maxc = _scores(k, kk, seed=k + kk, shift=shift)
    kw = dict(max_cosine=maxc, bootstrap=bootstrap, seed=3, index=index)
    new = canary_estimates(final, 1e-6, **kw)
    old = _report_before(monkeypatch, final, 1e-6, **kw)
    _assert_same_report(new, old)
    assert "epsilon_lower_bound_all_iterates" in new[0]


def test_report_at_the_issue_size_equals_the_report_before(monkeypatch) -> None:
    final, maxc = _scores(1000, 100_000, seed=11)
    new = canary_estimates(final, 1e-6, max_cosine=maxc, bootstrap=20, seed=0)
    old = _report_before(monkeypatch, final, 1e-6, max_cosine=maxc, bootstrap=20, seed=0)
    _assert_same_report(new, old)


def test_report_with_matched_gaussian_canaries_and_edge_cases(monkeypatch) -> None:
    rng = np.random.default_rng(9)
    dim = 20_000
    final = (rng.normal(3.0, 1.0, 150) / math.sqrt(dim), rng.normal(0.0, 1.0, 150) / math.sqrt(dim))
    m_scores = (rng.normal(2.0, 1.0, 150), rng.normal(0.0, 1.0, 150))
    m_est = CanaryScoreAuditor(*m_scores).epsilon_estimate(1e-5)
    _, maxc = _scores(150, 150, seed=2)
    cases = [
        dict(dim=dim, matched=(m_scores, m_est), max_cosine=maxc, bootstrap=25, index=2),
        dict(dim=dim, max_cosine=None, bootstrap=0),  # Gaussian canaries, no round yet
        dict(matched=(m_scores, m_est), max_cosine=None, bootstrap=0, index=5),
        dict(max_cosine=(maxc[0][:2], maxc[1][:2]), bootstrap=10),  # k = 2: no bootstrap
        dict(max_cosine=maxc, alpha=1.5),  # a bad level: every bound says why
        dict(max_cosine=maxc, delta=-1.0, index=3),  # a bad delta: every estimate says why
    ]
    for kw in cases:
        kw = {"delta": 1e-5, **kw}
        new = canary_estimates(final, seed=1, **kw)
        old = _report_before(monkeypatch, final, seed=1, **kw)
        _assert_same_report(new, old)
    # degenerate max cosines raise in both
    flat = (np.full(150, 0.1), maxc[1])
    with pytest.raises(ValueError) as a:
        canary_estimates(final, 1e-5, max_cosine=flat)
    with pytest.raises(ValueError) as b:
        _report_before(monkeypatch, final, 1e-5, max_cosine=flat)
    assert str(a.value) == str(b.value)


def test_report_with_flat_final_scores_matches(monkeypatch) -> None:
    # all-equal final unobserved scores: the auditor raises before anything, in both
    _, maxc = _scores(100, 300, seed=3)
    final = (maxc[0] - 0.03, np.zeros(300))
    with pytest.raises(ValueError) as a:
        canary_estimates(final, 1e-5, max_cosine=maxc)
    with pytest.raises(ValueError) as b:
        _report_before(monkeypatch, final, 1e-5, max_cosine=maxc)
    assert str(a.value) == str(b.value)


# ------------------------------------------------------------------------- bootstrap


def test_shared_resamples_equal_each_samples_own() -> None:
    rng = np.random.default_rng(12)
    a = (rng.normal(2e-3, 1e-3, 300), rng.normal(0.0, 1e-3, 7892))
    b = (rng.normal(5e-3, 2e-3, 300), rng.normal(1e-3, 2e-3, 7892))
    c = (rng.normal(1e-3, 1e-3, 50), None)  # other sizes: drawn on its own
    canary_epsilon.share_resamples([a, b, c], 70, 4)
    kept = dict(canary_epsilon._LAST_RESAMPLES)
    assert len(kept) == 3
    for obs, unobs in (a, b, c):
        shared = canary_epsilon._resample_moments(obs, unobs, 70, 4)  # from the memo
        canary_epsilon._LAST_RESAMPLES.clear()
        alone = canary_epsilon._resample_moments(obs, unobs, 70, 4)  # drawn afresh
        _LAST_BEFORE.clear()
        before = _resample_moments_before(obs, unobs, 70, 4)
        for x, y, z in zip(shared, alone, before, strict=True):
            if z is None:
                assert x is None and y is None
                continue
            assert np.array_equal(x, y)
            np.testing.assert_allclose(x, z, rtol=1e-12)
        canary_epsilon.share_resamples([a, b, c], 70, 4)
    with pytest.raises(ValueError, match="bootstrap"):
        canary_epsilon.share_resamples([a], 0, 4)
    score_auditor.share_bootstrap([CanaryScoreAuditor(*a)], -3, 0)  # a bad B: left to the estimate


def test_degenerate_resamples_are_still_exactly_zero() -> None:
    # k = 3 with two equal values: many resamples repeat one value; the sd must be exactly 0
    obs = np.array([1.0, 1.0, 1.0 + 1e-9]) + 5.0
    unobs = np.random.default_rng(0).normal(5.0, 1e-3, 40)
    mu1, s1, mu0, s0 = canary_epsilon._draw_moments([(obs, unobs)], 300, 1)[0]
    _LAST_BEFORE.clear()
    ref = _resample_moments_before(obs, unobs, 300, 1)
    assert np.array_equal(s1 == 0.0, ref[1] == 0.0) and (s1 == 0.0).any()
    np.testing.assert_allclose(s1, ref[1], rtol=1e-9, atol=0.0)


# ---------------------------------------------------------------------- GDP lower bound


def test_nct_lower_equals_the_scipy_stats_version() -> None:
    rng = np.random.default_rng(13)
    for _ in range(60):
        df = int(rng.integers(10, 200_000))
        t = float(rng.uniform(-5.0, 80.0))
        a = float(10.0 ** rng.uniform(-4.0, math.log10(0.2)))
        try:
            old = _nct_lower_before(t, df, a)
        except ValueError:  # the NaN tail (next test)
            continue
        assert _nct_lower(t, df, a) == old


@pytest.mark.parametrize("t_obs, df, alpha", [(3.5, 8190, 0.05 / 12), (5.0, 300_000, 1e-4),
                                              (7.5, 8190, 1e-9), (4.5, 101_000, 0.05 / 12)])
def test_nct_lower_past_the_nan_tail_of_the_cdf(t_obs, df, alpha) -> None:
    # where scipy's cdf is NaN far in a tail, the old root finding stopped; the root is found
    with pytest.raises(ValueError, match="NaN"):
        _nct_lower_before(t_obs, df, alpha)
    lam = _nct_lower(t_obs, df, alpha)
    assert math.isfinite(lam) and lam < t_obs
    assert float(nctdtr(df, lam, t_obs)) == pytest.approx(1.0 - alpha, abs=1e-9 * alpha + 1e-14)


def test_nct_lower_is_vacuous_when_the_root_may_lie_in_the_nan_tail() -> None:
    # at alpha = 1e-12 the root may lie where the cdf is NaN: -inf (valid), never a wrong root
    with pytest.raises(ValueError, match="NaN"):
        _nct_lower_before(8.5, 8190, 1e-12)
    assert _nct_lower(8.5, 8190, 1e-12) == -math.inf
    assert math.isfinite(_nct_lower(7.5, 8190, 1e-9))
    assert _nct_lower(30.0, 8190, 1e-12) > 0.0  # no NaN met: the root as before
    assert _nct_lower(30.0, 8190, 1e-12) == _nct_lower_before(30.0, 8190, 1e-12)


def test_gdp_bound_at_a_logged_point_is_no_longer_skipped() -> None:
    # a weak effect at k' = 8190 and the 3rd logged point's level (alpha / 12): before, the
    # GDP bound was skipped with "The function value at x=... is NaN"
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.normal(0.0, 1.0, 300), rng.normal(0.0, 1.0, 7890)
        x += (3.5 - (x.mean() - y.mean()) / math.sqrt(1 / 300 + 1 / 7890)) * math.sqrt(1 / 300 + 1 / 7890)
        r = CanaryScoreAuditor(x, y).epsilon_gdp_lower_bound(0.05 / 12, 1e-5)
        assert math.isfinite(r.value) and r.value >= 0.0
        assert r.details["mu_lower"] is not None and math.isfinite(r.details["mu_lower"])


def test_nct_lower_keeps_the_nan_tail_rule_to_the_measured_df_and_t_range(monkeypatch) -> None:
    # the NaN-tail substitution was measured for df >= 10 and |t_obs| <= 300 only: outside that
    # range a NaN cdf gives the vacuous -inf, never a substituted 1 or 0 that could move the root
    monkeypatch.setattr(score_auditor, "nctdtr", lambda df, lam, t: math.nan if lam < t - 3.0 else nctdtr(df, lam, t))
    assert _nct_lower(2.0, 5, 0.05) == -math.inf  # df below the measured range
    assert _nct_lower(400.0, 8190, 0.05) == -math.inf  # t_obs beyond it
    assert math.isfinite(_nct_lower(3.5, 8190, 0.05))  # inside it: substituted, the root found

