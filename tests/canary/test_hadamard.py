"""Hadamard canaries: the transform, the rows, their statistics, and the estimates they give."""

import math

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard

from audit_callbacks.canary.statistics import CanaryStatistics
from audit_callbacks.canary.vectors import (
    CanarySet,
    HadamardCanaries,
    _butterflies,
    _fwht_kronecker,
    _fwht_low_block,
    _hadamard_block,
    _matmul_is_exact,
    fwht,
)
from audit_callbacks.estimators import gaussian_epsilon
from audit_callbacks.estimators.canary_epsilon import estimate_epsilon_from_cosines
from audit_callbacks.estimators.canary_report import canary_estimates
from audit_callbacks.estimators.lower_bound import estimate_epsilon_lower_bound_from_cosines

# every implementation of the transform: the public dispatch, and each path forced on CPU
_PATHS = {
    "fwht": fwht,
    "loop": lambda x: _butterflies(x.reshape(x.shape[0], -1).clone(), 1).view(x.shape),
    "low_block": lambda x: _fwht_low_block(x, 32) if x.dim() == 1 else fwht(x),
    "kronecker": lambda x: _fwht_kronecker(x.reshape(x.shape[0], -1), 128).view(x.shape),
    "kronecker_small_blocks": lambda x: _fwht_kronecker(x.reshape(x.shape[0], -1), 4).view(x.shape),
}


def _parity_rows(n: int, rows: list[int]) -> torch.Tensor:
    """The definition: ``H[r, i] = (-1)^popcount(r & i)`` for the given rows, float64."""
    i = torch.arange(n, dtype=torch.int64)
    out = []
    for r in rows:
        x = i & r
        for shift in (32, 16, 8, 4, 2, 1):
            x = x ^ (x >> shift)
        out.append(1.0 - 2.0 * (x & 1).double())
    return torch.stack(out)


@pytest.mark.parametrize("path", sorted(_PATHS))
@pytest.mark.parametrize("n", [1, 2, 4, 8, 64, 256])
def test_fwht_is_the_hadamard_matrix_product(n, path):
    f = _PATHS[path]
    H = torch.tensor(hadamard(n), dtype=torch.float64)
    x = torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    assert torch.allclose(f(x), H @ x, atol=1e-12)
    assert torch.allclose(f(x[:, 0].contiguous()), H @ x[:, 0], atol=1e-12)
    assert torch.allclose(f(f(x)), n * x, atol=1e-9)  # H H = n I
    before = x.clone()
    f(x)
    assert torch.equal(x, before)  # the input is not modified


@pytest.mark.parametrize("path", ["fwht", "low_block", "kronecker", "kronecker_small_blocks"])
def test_fwht_at_every_size_matches_the_definition(path):
    # n = 2^0 .. 2^21: a few rows against the parity definition (float64: 1e-12 of the scale),
    # the whole vector against the butterfly loop; float32 within 1e-6 of ||H x||
    f = _PATHS[path]
    g = torch.Generator().manual_seed(0)
    for m in range(22):
        n = 1 << m
        x = torch.randn(n, dtype=torch.float64, generator=g)
        y = f(x)
        assert y.shape == x.shape and y.dtype == torch.float64 and y.is_contiguous()
        rows = sorted({0, n - 1, n // 3, (5 * n) // 7})
        exact = _parity_rows(n, rows) @ x
        scale = torch.linalg.vector_norm(x).item()
        assert torch.allclose(y[rows], exact, rtol=0, atol=1e-12 * scale), m
        ref = _PATHS["loop"](x)
        assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)).item() < 1e-13, m
        y32 = f(x.float())
        assert y32.dtype == torch.float32
        err = torch.linalg.vector_norm(y32.double() - ref) / torch.linalg.vector_norm(ref)
        assert err.item() < 1e-6, (m, err.item())


@pytest.mark.parametrize("path", sorted(_PATHS))
def test_fwht_batch_columns_and_layouts(path):
    f = _PATHS[path]
    g = torch.Generator().manual_seed(1)
    for n in (2, 1 << 10, 1 << 17):
        x = torch.randn(n, 2, 3, generator=g, dtype=torch.float64)
        y = f(x)
        assert y.shape == (n, 2, 3) and y.is_contiguous()
        flat = x.reshape(n, 6)
        for c in range(6):  # a column's transform does not depend on the other columns
            assert torch.allclose(y.reshape(n, 6)[:, c], _PATHS["loop"](flat[:, c].contiguous()), atol=1e-9)
        # a non-contiguous input (a transposed matrix's columns) gives the same numbers
        xt = torch.randn(4, n, generator=g, dtype=torch.float64).t()
        assert not xt.is_contiguous()
        assert torch.allclose(f(xt), f(xt.contiguous()), atol=1e-9)


def test_fwht_rejects_bad_input():
    with pytest.raises(ValueError, match="power of 2"):
        fwht(torch.zeros(6))
    with pytest.raises(ValueError, match="power of 2"):
        fwht(torch.zeros(0))
    with pytest.raises(ValueError, match="power of 2"):
        fwht(torch.tensor(1.0))
    with pytest.raises(ValueError, match="floating"):
        fwht(torch.zeros(8, dtype=torch.int64))


def test_fwht_keeps_full_precision_when_matmuls_may_not():
    # TF32 / bf16 matmuls (torch.set_float32_matmul_precision("high")) would cost 1e-3: float32
    # then takes the butterfly loop; float64 matmuls are never reduced
    x = torch.randn(1 << 17, generator=torch.Generator().manual_seed(2))
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert not _matmul_is_exact(x) and _matmul_is_exact(x.double())
        assert torch.equal(fwht(x), _PATHS["loop"](x))
    finally:
        torch.set_float32_matmul_precision(previous)
    assert _matmul_is_exact(x) and not _matmul_is_exact(x.half())
    assert torch.allclose(fwht(x.half()).float(), fwht(x), rtol=0, atol=0.05 * x.abs().max().item() * 2**9)


def test_hadamard_blocks_are_built_once_and_are_sylvester():
    a = _hadamard_block(64, torch.float32, torch.device("cpu"))
    assert a is _hadamard_block(64, torch.float32, torch.device("cpu"))
    assert torch.equal(a, torch.tensor(hadamard(64), dtype=torch.float32))


def test_a_canary_is_its_row_of_the_signed_hadamard_matrix():
    # large n: the per-canary definition computed through the transform of a unit vector
    dim = 70_001
    cs = CanarySet(seed=3, dim=dim, num_canaries=40, kind="hadamard")
    assert isinstance(cs, HadamardCanaries) and cs.n == 65_536  # 2^floor(log2 d)
    for j in (0, 17, 39):
        e = torch.zeros(cs.n, dtype=torch.float64)
        e[int(cs.rows[j])] = 1.0
        ref = torch.zeros(dim)
        ref[: cs.n] = (fwht(e) * cs.signs.double() / math.sqrt(cs.n)).float()
        got = cs.canary(j)
        assert torch.equal(got, ref), j
        assert torch.linalg.vector_norm(got.double()).item() == pytest.approx(1.0, abs=1e-6)
    # small n: against the explicit matrix, zero beyond n
    small = CanarySet(seed=1, dim=12, num_canaries=8, kind="hadamard")
    H = torch.tensor(hadamard(8), dtype=torch.float32)
    explicit = torch.zeros(8, 12)
    explicit[:, :8] = (H[small.rows] * small.signs) / math.sqrt(8)
    assert torch.allclose(small.batch(range(8)), explicit, atol=1e-7)
    with pytest.raises(ValueError, match="at most n = 8"):
        CanarySet(seed=1, dim=12, num_canaries=9, kind="hadamard")


@pytest.mark.parametrize("dim", [1210, 2035, 13_706, 70_001])
def test_hadamard_canaries_are_exactly_orthogonal(dim):
    """Any two canaries are orthogonal: rows of H_n on n = 2^floor(log2 d) coordinates. Rows of
    H_{2^ceil(log2 d)} cut to d coordinates (before issue 28) were not: indices differing only
    in the top bit gave cosines (2^ceil(log2 d) - d) / d, 0.69 at d = 1,210."""
    k = min(600, 1 << (dim.bit_length() - 1))
    rows = CanarySet(seed=0, dim=dim, num_canaries=k, kind="hadamard").batch(range(k)).double()
    gram = rows @ rows.t()
    assert torch.allclose(gram, torch.eye(k, dtype=torch.float64), atol=1e-6)
    n_up = 1 << (dim - 1).bit_length()  # the old construction's length, for the record
    if n_up > dim:
        old = _parity_rows(n_up, [0, n_up // 2])[:, :dim]
        assert abs(float(old[0] @ old[1])) / dim == pytest.approx((n_up - dim) / dim)


def _batch_one_canary_at_a_time(cs: HadamardCanaries, indices, scale: float = 1.0) -> torch.Tensor:
    """``HadamardCanaries.batch`` before issue 28 (a loop over canaries): the reference."""
    coords = torch.arange(cs.n, dtype=torch.int64)
    out = torch.zeros(len(indices), cs.dim, dtype=torch.float32)
    for i, j in enumerate(indices):
        x = coords & int(cs.rows[j])
        for shift in (32, 16, 8, 4, 2, 1):
            x ^= x >> shift
        out[i, : cs.n] = (1 - 2 * (x & 1)) * cs.signs * (cs.scale * float(scale))
    return out


@pytest.mark.parametrize("dim", [2, 3, 5, 16, 17, 1000, 4096, 70_001])
def test_batch_builds_all_rows_at_once_bit_for_bit(dim):
    # the outer-product rows equal the parity definition exactly, for every dim (odd n's
    # split, d far below n), any index order, repeats, a scale, and no index at all
    k = min(dim, 40) if dim > 2 else 2
    n = 1 << (dim.bit_length() - 1)
    cs = CanarySet(seed=dim, dim=dim, num_canaries=min(k, n), kind="hadamard")
    idx = [cs.num_canaries - 1, 0, 0, cs.num_canaries // 2]
    for scale in (1.0, 2.5):
        assert torch.equal(cs.batch(idx, scale=scale), _batch_one_canary_at_a_time(cs, idx, scale))
    assert cs.batch([]).shape == (0, dim)
    exact = torch.zeros(len(idx), dim, dtype=torch.float64)
    exact[:, : cs.n] = _parity_rows(cs.n, [int(cs.rows[j]) for j in idx]) * cs.signs.double()
    assert torch.allclose(cs.batch(idx).double() * math.sqrt(cs.n), exact, atol=1e-6)
    with pytest.raises(IndexError):
        cs.batch([cs.num_canaries])


def test_dots_and_sums_by_one_transform_equal_the_rows():
    dim = 5000
    cs = CanarySet(seed=2, dim=dim, num_canaries=300, kind="hadamard")
    rows = cs.batch(range(300)).double()
    g = torch.Generator().manual_seed(0)
    v = torch.randn(dim, generator=g)
    w = torch.randn(3, dim, generator=g)
    assert torch.allclose(cs.dots(v), rows @ v.double(), atol=1e-5)
    assert torch.allclose(cs.dots(w), rows @ w.double().t(), atol=1e-5)
    idx = [5, 0, 299, 5]
    assert torch.allclose(cs.dots(v, idx), rows[idx] @ v.double(), atol=1e-5)
    assert torch.allclose(cs.sum(idx).double(), rows[idx].sum(0), atol=1e-6)
    weights = torch.tensor([0.5, -1.0, 2.0, 1.0])
    assert torch.allclose(cs.sum(idx, weights=weights).double(), weights.double() @ rows[idx], atol=1e-6)
    cos = cs.cosines(v)
    assert torch.allclose(cos, rows @ v.double() / torch.linalg.vector_norm(v.double()), atol=1e-7)


def test_rows_are_seeded_distinct_and_orthogonal_at_full_length():
    a = CanarySet(seed=4, dim=1024, num_canaries=1024, kind="hadamard")
    assert torch.equal(a.rows, CanarySet(seed=4, dim=1024, num_canaries=1024, kind="hadamard").rows)
    assert a.rows.unique().numel() == 1024  # every row once
    assert not torch.equal(a.rows[:10], CanarySet(seed=5, dim=1024, num_canaries=10, kind="hadamard").rows)
    rows = a.batch(range(1024)).double()
    assert torch.allclose(rows @ rows.t(), torch.eye(1024, dtype=torch.float64), atol=1e-6)
    with pytest.raises(ValueError, match="num_canaries"):
        CanarySet(seed=0, dim=1000, num_canaries=1025, kind="hadamard")
    with pytest.raises(ValueError, match="kind"):
        CanarySet(seed=0, dim=1000, num_canaries=5, kind="sparse")
    with pytest.raises(IndexError):
        a.canary(1024)


def test_memory_is_o_of_n_plus_k():
    cs = CanarySet(seed=0, dim=100_000, num_canaries=50_000, kind="hadamard")
    held = sum(v.numel() * v.element_size() for v in vars(cs).values() if isinstance(v, torch.Tensor))
    assert held == 4 * cs.n + 8 * 50_000


def test_cosines_with_a_fixed_vector_have_mean_zero_and_variance_one_over_d():
    # Parseval: over all n rows the squared dot products average ||v||^2 (exact); a random
    # subset of rows has mean 0 and variance 1/d
    dim = 4096
    cs = CanarySet(seed=6, dim=dim, num_canaries=4096, kind="hadamard")
    v = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    cos = cs.cosines(v).numpy()
    assert np.mean(cos**2) == pytest.approx(1 / dim, rel=1e-6)
    assert abs(np.mean(cos[:500])) < 4 / math.sqrt(500 * dim)


def _round(kind: str, dim: int, k: int, k_un: int, sigma: float, seed: int, real: torch.Tensor | None = None):
    """One Gaussian-mechanism release: canaries 0..k-1 inserted (each the clipped update
    c_j, C = 1), noise sigma N(0, I), plus an optional real update; cosines of all canaries."""
    cs = CanarySet(seed=seed, dim=dim, num_canaries=k + k_un, kind=kind)
    g = torch.Generator().manual_seed(seed + 1000)
    release = cs.sum(range(k)).double() + sigma * torch.randn(dim, generator=g, dtype=torch.float64)
    if real is not None:
        release = release + real.double()
    cos = cs.cosines(release).numpy()
    return cos[:k], cos[k:]


def test_standardized_shift_is_one_over_sigma_for_both_kinds():
    # the shift of observed against unobserved cosines, in units of the null's sd, is 1/sigma
    # (Andrew et al. Thm 3.3); Hadamard and Gaussian canaries agree
    dim, k, k_un, sigma = 16_384, 1000, 8000, 2.0
    shifts = {}
    for kind in ("hadamard", "gaussian"):
        obs, un = _round(kind, dim, k, k_un, sigma, seed=3)
        shifts[kind] = (obs.mean() - un.mean()) / un.std(ddof=1)
        assert obs.std(ddof=1) / un.std(ddof=1) == pytest.approx(1.0, abs=0.1)
    se = math.sqrt(1 / k + 1 / k_un)
    for kind, shift in shifts.items():
        assert abs(shift - 1 / sigma) < 4 * se, (kind, shift)
    assert abs(shifts["hadamard"] - shifts["gaussian"]) < 4 * math.sqrt(2) * se


def test_estimates_of_the_two_kinds_agree_within_their_intervals():
    dim, k, k_un, sigma, delta = 16_384, 1000, 1000, 1.0, 1e-5
    out = {}
    for kind in ("hadamard", "gaussian"):
        obs, un = _round(kind, dim, k, k_un, sigma, seed=8)
        out[kind] = estimate_epsilon_from_cosines(obs, delta, unobserved=un, fit="equal",
                                                  bootstrap=200, seed=0)
    h, gs = out["hadamard"], out["gaussian"]
    assert h.lower <= gs.value <= h.upper and gs.lower <= h.value <= gs.upper
    truth = gaussian_epsilon(sigma, delta)
    assert h.lower <= truth <= h.upper


def test_heldout_lower_bound_covers_with_hadamard_scores():
    # Coverage by repetition: the held-out 95% lower bound exceeds the true epsilon of the
    # Gaussian mechanism in at most 5% of data sets (plus binomial slack)
    dim, k, k_un, sigma, delta, runs = 4096, 500, 1500, 0.5, 1e-5, 60
    truth = gaussian_epsilon(sigma, delta)
    exceed = 0
    values = []
    for r in range(runs):
        obs, un = _round("hadamard", dim, k, k_un, sigma, seed=100 + r)
        lo = estimate_epsilon_lower_bound_from_cosines(obs, delta, unobserved=un, threshold="heldout", seed=r)
        values.append(lo.value)
        exceed += lo.value > truth
    assert exceed <= 0.05 * runs + 2 * math.sqrt(0.05 * 0.95 * runs)
    assert np.mean(values) > 0.2 * truth  # and it is not vacuous


def test_the_logged_bounds_cover_with_hadamard_scores():
    # the two bounds CanaryAudit logs (Clopper-Pearson with Bonferroni, parametric GDP), on
    # Hadamard canaries' cosines of the Gaussian mechanism: at most 5% (+ slack) above the truth
    from audit_callbacks.estimators import CanaryScoreAuditor

    dim, k, k_un, sigma, delta, runs = 4096, 400, 2000, 0.7, 1e-5, 60
    truth = gaussian_epsilon(sigma, delta)
    over = {"cp": 0, "gdp": 0}
    gdp = []
    for r in range(runs):
        obs, un = _round("hadamard", dim, k, k_un, sigma, seed=500 + r)
        auditor = CanaryScoreAuditor(obs, un)
        over["cp"] += auditor.epsilon_lower_bound(0.05, delta).value > truth
        g = auditor.epsilon_gdp_lower_bound(0.05, delta).value
        gdp.append(g)
        over["gdp"] += g > truth
    slack = 0.05 * runs + 2 * math.sqrt(0.05 * 0.95 * runs)
    assert over["cp"] <= slack and over["gdp"] <= slack, over
    assert np.mean(gdp) > 0.6 * truth  # tight, not vacuous


def test_heavy_coordinates_are_handled_by_the_empirical_null():
    # A real update dominated by a few huge coordinates: sign-sum cosines are then far from the
    # Beta law. No canary inserted (pure null): the empirical null gives a near-zero estimate
    # and lower bound; the Beta law would report a large, wrong epsilon.
    dim, k, k_un = 4096, 500, 3000
    real = torch.zeros(dim)
    real[:3] = torch.tensor([300.0, -200.0, 150.0])
    cs = CanarySet(seed=2, dim=dim, num_canaries=k + k_un, kind="hadamard")
    release = real + 0.01 * torch.randn(dim, generator=torch.Generator().manual_seed(0))
    cos = cs.cosines(release).numpy()
    obs, un = cos[:k], cos[k:]
    estimates, _ = canary_estimates((obs, un), 1e-5, seed=0)
    assert estimates["epsilon_final_model"].value < 0.3
    assert estimates["epsilon_lower_bound_final_model"].value < 0.1
    gdp = estimates.get("epsilon_gdp_lower_bound_final_model")  # given only if its fit passes
    assert gdp is None or gdp.value < 0.1
    # the Beta law is the wrong null for these scores: it reports a large epsilon
    beta, _ = canary_estimates((obs, un), 1e-5, dim=dim, seed=0)
    assert beta["epsilon_final_model"].value > 2.0


def test_statistics_fold_every_round_exactly_and_resume_bit_for_bit():
    dim, k, k_un = 3000, 30, 200
    cs = CanarySet(seed=9, dim=dim, num_canaries=k + k_un, kind="hadamard")
    g = torch.Generator().manual_seed(2)
    deltas = [torch.randn(dim, generator=g) for _ in range(9)]
    theta = sum(deltas)
    full = CanaryStatistics(cs, k, k_un, sign=-1.0)
    full.set_initial(torch.zeros(dim))
    for d in deltas:
        full.add_delta(d)
    ref = full.compute(theta)
    rows = cs.batch(range(k + k_un)).double()
    D = torch.stack(deltas).double()
    exact = (-(rows @ D.t()) / torch.linalg.vector_norm(D, dim=1)).max(dim=1).values
    assert torch.allclose(ref["all_observed"], exact[:k], atol=1e-6)
    assert torch.allclose(ref["all_unobserved"], exact[k:], atol=1e-6)
    assert torch.allclose(ref["final_observed"], -(rows[:k] @ theta.double()) / theta.double().norm(), atol=1e-6)
    a = CanaryStatistics(cs, k, k_un, sign=-1.0)
    a.set_initial(torch.zeros(dim))
    for d in deltas[:4]:
        a.add_delta(d)
    b = CanaryStatistics(cs, k, k_un, sign=-1.0)
    b.load_state_dict(a.state_dict())
    for d in deltas[4:]:
        b.add_delta(d)
    got = b.compute(theta)
    for key in ref:
        assert torch.equal(got[key], ref[key]), key
    gaussian = CanaryStatistics(CanarySet(seed=9, dim=dim, num_canaries=k + k_un), k, k_un, sign=-1.0)
    with pytest.raises(ValueError, match="kind"):
        gaussian.load_state_dict(a.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hadamard_canaries_are_the_same_on_cuda():
    cs = CanarySet(seed=1, dim=10_000, num_canaries=100, kind="hadamard")
    v = torch.randn(10_000)
    assert torch.allclose(cs.dots(v.cuda()).cpu(), cs.dots(v), atol=1e-5)
    assert torch.equal(cs.batch(range(5), device="cuda").cpu(), cs.batch(range(5)))


def test_dots_of_one_vector_gather_from_the_column_with_the_same_bits():
    """One vector (alone, as a one-vector list, with indices): the gather from the transform's
    column as ``[n]`` gives the bits of the gather from ``[n, 1]`` (the general path's)."""
    cs = HadamardCanaries(3, 1500, 40)
    v = torch.randn(1500, generator=torch.Generator().manual_seed(2))
    two = cs.dots([v, v])  # the general path: columns of [n, 2]
    assert torch.equal(cs.dots(v), two[:, 0])
    one = cs.dots([v])
    assert one.shape == (40, 1) and torch.equal(one[:, 0], two[:, 1])
    idx = [5, 0, 39]
    assert torch.equal(cs.dots(v, idx), cs.dots([v, v], idx)[:, 0])
