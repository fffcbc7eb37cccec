"""Hadamard canaries' transform, dot products and rows in few dispatched ops, with the bits of
the implementation before.

The references below are the code as it was (a view and a transpose before each Kronecker
matmul, ``v[:n]`` sliced, the gather by ``index_select`` followed by ``.to(float64)``, the rows'
factors gathered on the device from shifted and masked indices): the new code must give the
same bits on random inputs (float32, float64 and float16 vectors; d a power of two or not, up
to d = 125,626 and 300,000, which take the Kronecker and the low-block paths; float16 and many
columns, which take the butterfly loop), and dispatch fewer aten ops (CPU profiler, nested
events included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from audit_callbacks.canary.vectors import (
    _CPU_KRON_BLOCK,
    _CPU_KRON_MAX_N,
    _CPU_LOW_BLOCK,
    _CPU_MIN_N,
    CanarySet,
    _butterflies,
    _hadamard_block,
    _hadamard_rows_host,
    _host_index,
    _matmul_is_exact,
    _parity_signs,
    fwht,
)


# ------------------------------------------------------------------ the code before
def _old_butterflies(cur: torch.Tensor, h: int) -> torch.Tensor:
    n = cur.shape[0]
    nxt = torch.empty_like(cur)
    while h < n:
        a = cur.view(n // (2 * h), 2, h, -1)
        b = nxt.view(n // (2 * h), 2, h, -1)
        torch.add(a[:, 0], a[:, 1], out=b[:, 0])
        torch.sub(a[:, 0], a[:, 1], out=b[:, 1])
        cur, nxt = nxt, cur
        h *= 2
    return cur


def _old_low_block(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[0]
    b = min(block, n)
    low = torch.mm(x.reshape(n // b, b), _hadamard_block(b, x.dtype, x.device))
    return _old_butterflies(low.view(n, 1), b).view(n)


def _old_kronecker(x: torch.Tensor, max_block: int) -> torch.Tensor:
    n, m = x.shape
    bits = n.bit_length() - 1
    parts = max(1, -(-bits // (max_block.bit_length() - 1)))
    cur = x.reshape(-1)
    for j in range(parts):
        a = 1 << (bits // parts + (j < bits % parts))
        cur = torch.mm(cur.view(a, -1).t(), _hadamard_block(a, x.dtype, x.device)).view(-1)
    return cur.view(n, m) if m == 1 else cur.view(m, n).t().contiguous()


def _old_fwht(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    cols = x.reshape(n, -1)
    if n > 1 and 0 < n * cols.shape[1] <= _CPU_KRON_MAX_N and _matmul_is_exact(x):
        return _old_kronecker(cols, _CPU_KRON_BLOCK).view(x.shape)
    if n >= _CPU_MIN_N and cols.shape[1] == 1 and _matmul_is_exact(x):
        return _old_low_block(cols.reshape(n), _CPU_LOW_BLOCK).view(x.shape)
    cur = cols.clone() if cols.is_contiguous() else cols.contiguous()
    return _old_butterflies(cur, 1).view(x.shape)


def _old_dots(cs, v: torch.Tensor) -> torch.Tensor:
    head = v[: cs.n]
    x = torch.mul(head if head.dtype == torch.float32 else head.to(torch.float32), cs.signs).unsqueeze(1)
    y = _old_fwht(x)
    return torch.index_select(y.view(-1), 0, cs.rows).to(torch.float64).mul_(cs.scale)


def _old_batch(cs, indices: np.ndarray, scale: float) -> torch.Tensor:
    rows = cs._rows_host[indices]
    b = rows.size
    low_bits = (cs.n.bit_length() - 1) // 2
    width = 1 << low_bits
    high_len = cs.n // width
    out = torch.empty(b, cs.dim)
    if cs.dim > cs.n:
        out[:, cs.n:].zero_()
    main = out[:, : cs.n].view(b, high_len, width)
    r_dev = _host_index(rows, torch.device("cpu"))
    low = _parity_signs(r_dev & (width - 1), width)
    high = _parity_signs(r_dev >> low_bits, high_len)
    torch.mul(high[:, :, None], low[:, None, :], out=main)
    main.mul_((cs.signs * (cs.scale * scale)).view(high_len, width))
    return out


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


def _events(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name.startswith("aten::") for e in prof.events())


# ------------------------------------------------------------------ the bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_fwht_has_the_bits_of_before_at_every_size(dtype):
    gen = torch.Generator().manual_seed(0)
    for k in range(19):  # n = 1 .. 2^18: the Kronecker, low-block and loop (float16) paths
        n = 1 << k
        x = (torch.randn(n, generator=gen) * 3).to(dtype)
        before = x.clone()
        assert _bits(fwht(x)) == _bits(_old_fwht(x)), n
        assert _bits(fwht(x.unsqueeze(1))) == _bits(_old_fwht(x.unsqueeze(1))), n
        assert torch.equal(x, before)
        if n <= 1 << 13:
            cols = torch.randn(n, 3, generator=gen).to(dtype)
            assert _bits(fwht(cols)) == _bits(_old_fwht(cols)), n
            strided = torch.randn(2 * n, generator=gen).to(dtype)[::2]
            assert _bits(fwht(strided)) == _bits(_old_fwht(strided)), n
            many = torch.randn(n, 40, generator=gen).to(dtype)  # the loop, several columns
            assert _bits(fwht(many)) == _bits(_old_fwht(many)), n
        if n >= 2:  # the loop from any level, on a strided input
            wide = torch.randn(5, n, generator=gen).to(dtype).t()
            assert _bits(_butterflies(wide.clone(), 1)) == _bits(_old_butterflies(wide.contiguous(), 1))


@pytest.mark.parametrize("dim", [2, 3, 100, 1000, 1500, 2244, 24420, 65536, 125_626, 300_000])
def test_dots_and_rows_have_the_bits_of_before(dim):
    k = min(CanarySet(1, dim, 0, kind="hadamard").n, 600)
    cs = CanarySet(11, dim, k, kind="hadamard")
    gen = torch.Generator().manual_seed(dim)
    for dtype in (torch.float32, torch.float64, torch.float16):
        v = (torch.randn(dim, generator=gen) * 2).to(dtype)
        ref = _old_dots(cs, v)
        assert _bits(cs.dots(v)) == _bits(ref), dtype
        assert _bits(cs.dots([v])[:, 0]) == _bits(ref), dtype
    v = torch.randn(dim, generator=gen)
    v[dim // 2] = float("nan")
    assert _bits(cs.dots(v)) == _bits(_old_dots(cs, v))
    picks = np.random.default_rng(dim).integers(0, k, size=min(k, 40))
    for scale in (1.0, 10.0, 0.37):
        ref = _old_batch(cs, picks, scale)
        assert _bits(cs.batch(picks, scale=scale)) == _bits(ref)
        out = torch.full((len(picks), dim), float("nan"))  # every entry written, the tail too
        assert _bits(cs.batch(picks, scale=scale, out=out)) == _bits(ref)
        assert _bits(cs.batch(picks[:1], scale=scale)) == _bits(ref[:1])


def test_host_rows_are_the_cached_sylvester_matrix():
    for size in (1, 2, 4, 64, 1024):
        table = _hadamard_rows_host(size)
        assert table.dtype == np.float32 and not table.flags.writeable
        assert np.array_equal(table, _hadamard_block(size, torch.float32, torch.device("cpu")).numpy())


# ------------------------------------------------------------------ the ops
def test_one_projection_and_the_rows_take_few_ops():
    """At d = 24,420 (n = 2^14: three Kronecker matmuls of 1 + 3 events each) a dot product
    with every canary is 17 events in all (before: 43), and the rows of 17 canaries 8 (before:
    31: the tail's slice and zero, the shifted and masked indices, two index_select)."""
    cs = CanarySet(2, 24420, 1000, kind="hadamard")
    v = torch.randn(24420)
    cs.dots(v)
    assert _events(lambda: cs.dots(v)) <= 17
    assert _events(lambda: _old_dots(cs, v)) >= 43  # (the reference: the count can fail)
    picks = np.sort(np.random.default_rng(0).choice(500, 17, replace=False))
    out = torch.empty(17, 24420)
    cs.batch(picks, out=out, scale=10.0)
    assert _events(lambda: cs.batch(picks, out=out, scale=10.0)) <= 8
    assert _events(lambda: _old_batch(cs, picks, 10.0)) >= 25
    # d = 10^6 (n = 2^19: the low-block path, then 14 butterfly levels of 6 events; before 16)
    big = CanarySet(2, 1_000_000, 100, kind="hadamard")
    w = torch.randn(1_000_000)
    big.dots(w)  # (the first call makes the gather's buffers)
    assert _events(lambda: big.dots(w)) <= 6 * 14 + 15  # 99 (before: 249)
    assert _events(lambda: _old_dots(big, w)) >= 16 * 14
