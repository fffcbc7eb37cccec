"""Seeded random canaries: canary ``j`` is a pure function of ``(seed, j)``, O(d) memory.

Two kinds, with the same methods (:meth:`~CanarySet.canary`, :meth:`~CanarySet.batch`,
:meth:`~CanarySet.sum`, :meth:`~CanarySet.dots`, :meth:`~CanarySet.cosines`):

* ``"gaussian"`` (:class:`GaussianCanaries`): a standard normal vector divided by its norm, i.e.
  uniform on the sphere S^{d-1} (Andrew et al., "One-shot Empirical Privacy Estimation for
  Federated Learning", ICLR 2024, §3). Canary ``j`` is drawn by a ``torch.Generator`` on the
  target device, seeded with :func:`canary_seed` ``(seed, j)``: the CPU's Mersenne Twister or
  CUDA's counter-based Philox. A run's canaries are reproducible on the same device type (a CUDA
  run's canaries differ from a CPU run's). Every dot product regenerates the canaries, so a pass
  over k canaries costs O(k d) normal draws. Its cosine with any fixed vector follows the exact
  law (1 + t)/2 ~ Beta((d-1)/2, (d-1)/2).
* ``"hadamard"`` (:class:`HadamardCanaries`): with H the n x n Walsh-Hadamard matrix
  (n = 2^floor(log2 d), the largest power of two <= d, H[r, i] = (-1)^popcount(r & i)) and D a
  diagonal of random signs, canary ``j`` is row ``pi(j)`` of ``H D`` divided by sqrt(n), on the
  first n of the d coordinates (0 on the others): every entry is +-1/sqrt(n), its norm is 1, and
  any two canaries are exactly orthogonal. ``pi`` is a random injection of the canary indices
  into the n rows. D and pi are drawn from ``numpy.random.default_rng`` of the seed on the CPU,
  so the canaries are the same on every device. The dot products of all n rows with a vector v
  are one fast Walsh-Hadamard transform ``FWHT(D * v[:n])`` (O(n log n)), and a sum of canaries
  is ``D * FWHT(indicator)``: one transform each, whatever k is. Each canary is a vector of
  independent random signs on n coordinates, so its cosine with a fixed v has mean 0 and
  variance ``|v[:n]|^2 / (n |v|^2)`` (1/d for isotropic noise) as for a Gaussian canary, but its
  law is not exactly the Beta law: estimates with Hadamard canaries take their null from
  unobserved canaries (the empirical null). Rows cut to the first d of 2^ceil(log2 d)
  coordinates (an older construction of this library) are not orthogonal: two rows whose indices differ
  only in bit b have cosine up to 2^b / d (0.69 at d = 1,210), which lets one canary's
  insertion move another's statistic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["CanarySet", "GaussianCanaries", "HadamardCanaries", "canary_seed", "cosines_from_dots", "fwht",
           "hadamard_length"]

KINDS = ("gaussian", "hadamard")
_DEFAULT_CHUNK_ELEMENTS = 1 << 22  # 4M floats (16 MiB in float32) per generated chunk


def hadamard_length(dim: int) -> int:
    """n = 2^floor(log2 dim): the transform length of Hadamard canaries in dimension ``dim``
    (the largest power of two <= dim), so at most n exactly orthogonal canaries exist."""
    return 1 << (int(dim).bit_length() - 1)


def canary_seed(seed: int, index: int) -> int:
    """The 63-bit generator seed of Gaussian canary ``index`` in the set seeded with ``seed``.

    Distinct ``(seed, index)`` pairs give statistically independent streams (SeedSequence
    hashing); the value is stable across processes and platforms.
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    state = np.random.SeedSequence([int(seed), int(index)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


_KRON_MAX_BLOCK = 128  # CUDA: the largest Hadamard block of the Kronecker factorisation
_CPU_LOW_BLOCK = 32  # CPU: the lowest log2(32) = 5 levels as one matmul with H_32
_CPU_MIN_N = 1 << 16  # CPU: below this n the butterfly loop alone is as fast (measured)
_CPU_KRON_BLOCK = 32  # CPU, n <= _CPU_KRON_MAX_N: Kronecker blocks of at most 32 x 32
_CPU_KRON_MAX_N = 1 << 17  # CPU: up to this many entries (n x columns) the Kronecker matmuls win (measured)


@functools.lru_cache(maxsize=64)
def _hadamard_block(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Sylvester's ``size x size`` Hadamard matrix (``H[r, i] = (-1)^popcount(r & i)``), built
    once per (size, dtype, device) by doubling ``[[H, H], [H, -H]]``; shared, never modified."""
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _butterflies(cur: torch.Tensor, h: int) -> torch.Tensor:
    """The butterfly levels ``h, 2h, ..., n/2`` of the transform along dim 0 of ``cur``
    (``[n, M]``, contiguous; overwritten: it is one of the two ping-pong buffers). A level's
    halves ``x.view(n / 2h, 2, h, M)[:, i]`` are taken as one ``as_strided`` each (the same
    views, 6 dispatched ops a level instead of 16; a strided ``cur`` is made contiguous first)."""
    if not cur.is_contiguous():
        cur = cur.contiguous()
    n = cur.shape[0]
    m = cur.numel() // n if n else 0
    nxt = torch.empty_like(cur)
    while h < n:
        size, stride = (n // (2 * h), h, m), (2 * h * m, m, 1)
        a0 = cur.as_strided(size, stride, cur.storage_offset())
        a1 = cur.as_strided(size, stride, cur.storage_offset() + h * m)
        torch.add(a0, a1, out=nxt.as_strided(size, stride, nxt.storage_offset()))
        torch.sub(a0, a1, out=nxt.as_strided(size, stride, nxt.storage_offset() + h * m))
        cur, nxt = nxt, cur
        h *= 2
    return cur


def _fwht_low_block(x: torch.Tensor, block: int) -> torch.Tensor:
    """``H x`` for a contiguous ``[n]`` vector: the lowest log2(block) levels as one matmul
    ``x.view(n / block, block) @ H_block`` (H_n = H_{n/block} (x) H_block), then butterflies."""
    n = x.shape[0]
    b = min(block, n)
    low = torch.mm(x.reshape(n // b, b), _hadamard_block(b, x.dtype, x.device))
    return _butterflies(low.view(n, 1), b).view(n)


def _kronecker_stages(flat: torch.Tensor, n: int, max_block: int) -> torch.Tensor:
    """The f matmuls of :func:`_fwht_kronecker` on ``flat``: the ``n * M`` entries of an
    ``[n, M]`` layout as a 1-D tensor (or any contiguous tensor of that many). Each
    stage contracts the leading axis of the ``[a_1, ..., a_f, M]`` layout against ``H_a`` and
    moves it last: ``cur.view(a, -1).t()`` is taken as one ``as_strided`` (the same sizes and
    strides, so the same matmul and bits, in one dispatched op instead of four). Returns the
    last matmul's output, contiguous: in memory order the entries of ``[M, n]`` (``[n]`` when
    M = 1)."""
    total = flat.numel()
    bits = n.bit_length() - 1
    parts = max(1, -(-bits // (max_block.bit_length() - 1)))
    cur = flat
    for j in range(parts):
        a = 1 << (bits // parts + (j < bits % parts))
        rest = total // a
        # (a strided input, first stage only: through its view, as before, for the same bits)
        lead = cur.as_strided((rest, a), (1, rest)) if cur.is_contiguous() else cur.view(a, -1).t()
        cur = torch.mm(lead, _hadamard_block(a, flat.dtype, flat.device))
    return cur


def _fwht_kronecker(x: torch.Tensor, max_block: int) -> torch.Tensor:
    """``H x`` for ``x`` of shape ``[n, M]`` by ``H_n = H_{a_1} (x) ... (x) H_{a_f}`` with
    Sylvester blocks ``a_j <= max_block`` of near-equal sizes: f matmuls. Each contracts the
    leading axis of the ``[a_1, ..., a_f, M]`` layout and moves it last, so after f steps the
    factors are back in order and M leads: one transpose restores ``[n, M]``
    (:func:`_kronecker_stages`)."""
    n, m = x.shape
    cur = _kronecker_stages(x.reshape(-1), n, max_block)
    return cur.view(n, m) if m == 1 else cur.view(m, n).t().contiguous()


def _matmul_is_exact(x: torch.Tensor) -> bool:
    """Whether a float32/float64 matmul on x's device keeps full precision (no TF32 or bf16
    inner products: ``torch.set_float32_matmul_precision("high")`` would cost 1e-3; none inside
    an autocast region of x's device, where a matmul runs in bfloat16 or float16)."""
    if torch.is_autocast_enabled(x.device.type):
        return False
    if x.dtype == torch.float64:
        return True
    if x.dtype != torch.float32 or torch.get_float32_matmul_precision() != "highest":
        return False
    return not (x.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)


@functools.lru_cache(maxsize=64)
def _arange(length: int, device: torch.device) -> torch.Tensor:
    """``0 .. length - 1`` as int64 on ``device``, built once (shared, never modified)."""
    return torch.arange(length, dtype=torch.int64, device=device)


_PARITY_TABLE_MAX = 1024  # up to this length the rows come from the cached Sylvester matrix (4 MiB)


def _parity_signs(rows: torch.Tensor, length: int) -> torch.Tensor:
    """``(-1)^popcount(r & c)`` for r in ``rows`` (``[b]`` int64, each in ``0 .. length - 1``)
    and c in ``0 .. length - 1`` (a power of 2): ``[b, length]`` float32 of +-1 on rows' device.
    Rows of the cached Sylvester matrix ``H_length`` (one gather) up to length 1024, else the
    parity by xor-folding the log2(length) bits of ``r & c``; the same values either way."""
    if length <= _PARITY_TABLE_MAX:
        return _hadamard_block(length, torch.float32, rows.device).index_select(0, rows)
    x = rows.unsqueeze(1) & _arange(length, rows.device)
    bits = length.bit_length() - 1  # r & c < length has at most this many bits
    for shift in (32, 16, 8, 4, 2, 1):
        if shift < bits:
            x ^= x >> shift
    return (1 - 2 * (x & 1)).to(torch.float32)


@functools.lru_cache(maxsize=16)
def _hadamard_rows_host(size: int) -> np.ndarray:
    """Sylvester's ``size x size`` Hadamard matrix as a read-only float32 numpy array, built
    once by doubling (the +-1 entries of :func:`_hadamard_block`): rows picked on the host
    cost no dispatched op."""
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    h.flags.writeable = False
    return h


def _index_tensor(indices: list[int], device: torch.device) -> torch.Tensor:
    """``indices`` as an int64 tensor on ``device``. To CUDA through pinned memory with
    ``non_blocking=True``: a pageable host-to-device copy would wait for the stream (a host
    synchronisation per call); the caching host allocator keeps the pinned block until the copy
    has run."""
    t = torch.tensor(indices, dtype=torch.int64)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _index_array(indices: np.ndarray, bound: int, device: torch.device) -> torch.Tensor:
    """An integer numpy array of indices in ``[0, bound)`` as an int64 tensor on ``device``
    (no Python list; to CUDA as :func:`_index_tensor`). ``IndexError`` for one out of range."""
    arr = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= bound):
        bad = int(arr[(arr < 0) | (arr >= bound)][0])
        raise IndexError(f"canary index {bad} out of range [0, {bound})")
    return _host_index(arr, device)


def _host_index(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    """A 1-D contiguous int64 numpy array (checked by the caller) as a tensor on ``device``:
    the array's own memory on the CPU, to CUDA as :func:`_index_tensor`."""
    t = torch.from_numpy(arr if arr.flags.writeable else arr.copy())  # a cohort's ids are read-only
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t if device.type == "cpu" else t.to(device)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh-Hadamard transform along dim 0: ``H @ x``.

    Args:
        x: ``[n]`` or ``[n, M]`` floating tensor, n a power of 2 (any device).

    Returns:
        ``H x`` of the same shape, dtype and device, contiguous, with
        ``H[r, i] = (-1)^popcount(r & i)`` (Sylvester's natural order; ``H @ H = n I``). ``x`` is
        not modified. O(n log n) additions, by whichever of these was measured fastest:

        * CUDA (and any non-CPU device), float32 at full matmul precision or float64: the
          Kronecker factorisation ``H_n = H_a (x) H_b (x) ...`` with Sylvester blocks of at most
          128 x 128 (built once per size, dtype and device), a few matmuls (measured on an
          H200: 4.9x the butterfly loop at n = 2^21, equal to 5e-7 relative);
        * CPU, n >= 2 and n M <= 2^17 entries (M columns), float32 at full matmul precision or
          float64: the same Kronecker factorisation with blocks of at most 32 x 32 (measured on
          2 shared cores, 1 thread, median of interleaved pairs against the loop: one column
          6.4x at n = 2^13, 1.9x at 2^16, 1.3x at 2^17, 1.0x at 2^18; 16 columns 2.8x at 2^10,
          1.0x at 2^13; 2 columns 1.15x at 2^16, 0.98x at 2^17);
        * CPU, one column, n >= 2^18: the lowest 5 levels as one matmul ``x.view(n/32, 32) @ H_32``
          (the loop's strided short-run passes are its slowest), then the butterfly loop
          (``benchmarks/fwht_speed.py`` on 2 shared cores: 1.5x at n = 2^16 - 2^18, 1.2-1.45x
          at 2^21, 1.2x at 2^24);
        * otherwise (several columns of more entries on CPU, float16/bfloat16, TF32 matmuls, inside
          an autocast region): the loop of log2(n) butterfly passes over two buffers of x's size.

        The paths agree to float rounding (float32: ~1e-7 of ``||H x||``), not bit for bit.

    Raises:
        ValueError: n is not a power of 2, or x is not floating.
    """
    n = x.shape[0] if x.dim() else 0
    if n < 1 or n & (n - 1):
        raise ValueError(f"fwht needs a leading dimension that is a power of 2, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"fwht needs a floating tensor, got {x.dtype}")
    if x.dim() == 1 and x.is_contiguous():  # one column: the output holds H x in memory order
        return _fwht_column(x, owned=False).view(n)
    cols = x.reshape(n, -1)
    if not x.is_cpu:
        if n > 1 and cols.shape[1] > 0 and _matmul_is_exact(x):
            return _fwht_kronecker(cols, _KRON_MAX_BLOCK).view(x.shape)
    elif n > 1 and 0 < n * cols.shape[1] <= _CPU_KRON_MAX_N and _matmul_is_exact(x):
        return _fwht_kronecker(cols, _CPU_KRON_BLOCK).view(x.shape)
    elif n >= _CPU_MIN_N and cols.shape[1] == 1 and _matmul_is_exact(x):
        return _fwht_low_block(cols.reshape(n), _CPU_LOW_BLOCK).view(x.shape)
    cur = cols.clone() if cols.is_contiguous() else cols.contiguous()  # a private copy, contiguous
    return _butterflies(cur, 1).view(x.shape)


def _fwht_column(x: torch.Tensor, *, owned: bool) -> torch.Tensor:
    """``H x`` for one contiguous column ``x`` ``[n]`` (n a power of 2, floating), by the path
    :func:`fwht` takes for it and with its bits, in fewer dispatched ops: a contiguous tensor
    whose entries in memory order are ``H x`` (on the Kronecker path its shape is the last
    matmul's, ``[n / a, a]``: view it as ``[n]`` or gather from it with ``torch.take``).
    ``owned``: ``x`` is the caller's own scratch, which the butterfly path may overwrite
    instead of copying it first."""
    n = x.shape[0]
    exact = n > 1 and _matmul_is_exact(x)
    if not x.is_cpu:
        if exact:
            return _kronecker_stages(x, n, _KRON_MAX_BLOCK)
    elif exact and n <= _CPU_KRON_MAX_N:
        return _kronecker_stages(x, n, _CPU_KRON_BLOCK)
    elif exact and n >= _CPU_MIN_N:
        return _fwht_low_block(x, _CPU_LOW_BLOCK)
    return _butterflies((x if owned else x.clone()).view(n, 1), 1)  # overwrites its input


def cosines_from_dots(dots: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """``clamp(dots / norms, -1, 1)``: the cosines of unit canaries with vectors whose dot
    products with them are ``dots`` and whose L2 norms are ``norms`` (float64, broadcastable:
    ``[n]`` and a 0-dim norm, or ``[n, M]`` and ``[1, M]``). A zero norm gives cosines 0; a NaN
    or inf norm (a vector with a NaN or inf entry) gives NaN cosines, on the device, with no
    host synchronisation. A new tensor; ``dots`` is not modified."""
    safe = torch.where(torch.isfinite(norms), torch.where(norms > 0, norms, 1.0), math.nan)
    return torch.div(dots, safe).clamp_(-1.0, 1.0)


def _check_out(out: torch.Tensor, rows: int, dim: int, device: Any) -> None:
    """``out`` must be a contiguous float32 ``[rows, dim]`` tensor on ``device``."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    same = out.device.type == dev.type and (dev.index is None or out.device.index == dev.index)
    if (tuple(out.shape) != (rows, dim) or out.dtype != torch.float32 or not same
            or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous float32 [{rows}, {dim}] tensor on {dev}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")


def _as_columns(vectors: torch.Tensor | Sequence[torch.Tensor], dim: int) -> tuple[list[torch.Tensor], bool]:
    single = isinstance(vectors, torch.Tensor) and vectors.dim() == 1
    cols = [vectors] if single else list(vectors)
    if not cols:
        raise ValueError("vectors: none given")
    for v in cols:
        if v.dim() != 1 or v.numel() != dim:
            raise ValueError(f"vectors must have {dim} entries each, got {tuple(v.shape)}")
        if not v.is_floating_point():
            raise ValueError(f"vectors must be floating, got {v.dtype}")
    return cols, single


class CanarySet:
    """``num_canaries`` unit canaries of dimension ``dim``, regenerated from ``seed``.

    ``CanarySet(seed, dim, num_canaries, kind="gaussian" | "hadamard")`` returns a
    :class:`GaussianCanaries` or a :class:`HadamardCanaries` (see the module docstring).

    Args:
        seed: the set's seed (non-negative int); canary j is a function of (seed, j) only.
        dim: the dimension d (number of model parameters); at least 2.
        num_canaries: k, the number of canaries (Hadamard: at most n = 2^floor(log2 d)).
        kind: ``"gaussian"`` (default) or ``"hadamard"``.
        chunk_elements: Gaussian only: at most this many floats are generated at once.

    Raises:
        ValueError: ``dim < 2``, ``num_canaries < 0`` (or > n for Hadamard), an unknown kind.

    Example:
        >>> cs = CanarySet(seed=0, dim=1000, num_canaries=10, kind="hadamard")
        >>> cs.cosines(torch.randn(1000)).shape
        torch.Size([10])
    """

    kind = "abstract"

    def __new__(cls, *args: Any, kind: str = "gaussian", **kwargs: Any) -> CanarySet:
        if cls is CanarySet:
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
            cls = GaussianCanaries if kind == "gaussian" else HadamardCanaries
        return super().__new__(cls)

    def __init__(self, seed: int, dim: int, num_canaries: int, *, kind: str | None = None) -> None:
        if int(seed) < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if dim < 2:
            raise ValueError(f"dim: canaries need dim >= 2 (the cosine null is undefined), got {dim}")
        if num_canaries < 0:
            raise ValueError(f"num_canaries must be >= 0, got {num_canaries}")
        if kind is not None and kind != self.kind:
            raise ValueError(f"kind {kind!r} given to {type(self).__name__}")
        self.seed = int(seed)
        self.dim = int(dim)
        self.num_canaries = int(num_canaries)

    def __len__(self) -> int:
        return self.num_canaries

    def _check_indices(self, indices: Sequence[int] | None) -> list[int]:
        idx = list(range(self.num_canaries)) if indices is None else [int(i) for i in indices]
        for i in idx:
            if not 0 <= i < self.num_canaries:
                raise IndexError(f"canary index {i} out of range [0, {self.num_canaries})")
        return idx

    # every kind implements these two
    def batch(
        self, indices: Sequence[int], *, scale: float = 1.0, device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``scale * c_j`` for j in ``indices``: ``[len(indices), dim]`` float32 on ``device``.

        ``out``: a float32 ``[len(indices), dim]`` tensor on ``device`` to write the rows into
        and return (a buffer reused from step to step: on the CPU a fresh allocation of k x d
        floats costs its page faults every time); None (default): a new tensor.

        Raises ``IndexError`` for an index outside ``[0, num_canaries)``; ``ValueError`` for an
        ``out`` of the wrong shape, dtype or device."""
        raise NotImplementedError

    def dots(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Dot products ``<c_j, v_m>``.

        Args:
            vectors: one ``[dim]`` vector, an ``[M, dim]`` matrix or a sequence of M ``[dim]``
                vectors (any floating dtype and device; canaries are made on that device).
            indices: canaries to use (default: all).

        Returns:
            ``[n]`` for a single vector, ``[n, M]`` otherwise, float64 on the vectors' device
            (n = number of canaries used). A column does not depend on the other columns.

        Raises:
            ValueError: a vector of the wrong size or dtype; IndexError: a bad index.
        """
        raise NotImplementedError

    def canary(
        self, index: int, *, device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32, scale: float = 1.0,
    ) -> torch.Tensor:
        """Canary ``index`` times ``scale``, shape ``[dim]``."""
        return self.batch([index], scale=scale, device=device)[0].to(dtype)

    def cosines(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
        *, check_finite: bool = True,
    ) -> torch.Tensor:
        """Cosines ``cos(c_j, v_m)`` in [-1, 1]; arguments and shapes as :meth:`dots`.

        A zero vector gives cosine 0. With ``check_finite`` (default) a vector with NaN or inf
        raises ``ValueError``, which reads one value back from the vectors' device (a host
        synchronisation on CUDA); ``check_finite=False`` never synchronises (Hadamard canaries:
        the transform, the selection and the division stay on the device) and gives NaN cosines
        in the whole column of a vector with a NaN or inf entry (and only there), for the caller
        to check when it reads them.
        """
        cols, single = _as_columns(vectors, self.dim)
        # float64 accumulation (torch converts the vector to float64 for it); finite exactly
        # when every entry is (float32 squares cannot overflow a float64 sum)
        norms = torch.stack([torch.linalg.vector_norm(v, dtype=torch.float64) for v in cols])
        if check_finite and not bool(torch.isfinite(norms).all()):
            raise ValueError("vectors: cannot take cosines against a vector with NaN or inf entries")
        dots = self.dots(cols, indices)
        # NaN in a non-finite vector's whole column (an inf entry outside the Hadamard canaries'
        # coordinates would otherwise give cosines 0): its divisor is NaN
        cos = cosines_from_dots(dots, norms.to(dots.device).unsqueeze(0))
        return cos[:, 0] if single else cos

    def sum(
        self, indices: Sequence[int] | None = None, *, weights: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``sum_j w_j c_j`` over ``indices`` (default: all; weights default 1): ``[dim]``
        float32 on ``device``. Memory O(dim) beyond one chunk."""
        idx = self._check_indices(indices)
        total = torch.zeros(self.dim, dtype=torch.float32, device=device)
        for start, block in self._blocks(idx, device):
            if weights is None:
                total += block.sum(0)
            else:
                w = weights[start:start + block.shape[0]].to(device=block.device, dtype=block.dtype)
                total += w @ block
        return total

    def _blocks(self, idx: list[int], device: Any) -> Iterator[tuple[int, torch.Tensor]]:
        step = max(1, _DEFAULT_CHUNK_ELEMENTS // self.dim)
        for start in range(0, len(idx), step):
            yield start, self.batch(idx[start:start + step], device=device)


class GaussianCanaries(CanarySet):
    """Canaries uniform on the sphere, regenerated chunk by chunk (see :class:`CanarySet`)."""

    kind = "gaussian"

    def __init__(
        self, seed: int, dim: int, num_canaries: int, *, kind: str | None = None,
        chunk_elements: int = _DEFAULT_CHUNK_ELEMENTS,
    ) -> None:
        super().__init__(seed, dim, num_canaries, kind=kind)
        if chunk_elements < 1:
            raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
        self.chunk_size = max(1, int(chunk_elements) // self.dim)
        self._seeds: dict[int, int] = {}  # SeedSequence hashing costs ~50 us: once per canary

    def _fill(self, idx: list[int], out: torch.Tensor, scale: float) -> None:
        gen = torch.Generator(device=out.device)
        for i, j in enumerate(idx):
            seed = self._seeds.get(j)
            if seed is None:
                seed = self._seeds[j] = canary_seed(self.seed, j)
            gen.manual_seed(seed)
            torch.randn(self.dim, generator=gen, out=out[i])
        rows = out[: len(idx)]
        rows.div_(torch.linalg.vector_norm(rows, 2.0, 1, True))
        if scale != 1.0:
            rows.mul_(scale)

    def batch(
        self, indices: Sequence[int], *, scale: float = 1.0, device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        idx = self._check_indices(indices)
        if out is None:
            out = torch.empty(len(idx), self.dim, dtype=torch.float32, device=device)
        else:
            _check_out(out, len(idx), self.dim, device)
        self._fill(idx, out, float(scale))
        return out

    def chunks(
        self, indices: Sequence[int] | None = None, *, device: torch.device | str | None = None,
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Yield ``(indices_chunk, canaries [b, dim] float32)`` over ``indices`` (default: all),
        at most ``chunk_size`` canaries at a time in one reused buffer."""
        idx = self._check_indices(indices)
        buf = torch.empty(min(self.chunk_size, max(1, len(idx))), self.dim, dtype=torch.float32,
                          device=device)
        for start in range(0, len(idx), self.chunk_size):
            part = idx[start:start + self.chunk_size]
            self._fill(part, buf, 1.0)
            yield part, buf[: len(part)]

    def _blocks(self, idx: list[int], device: Any) -> Iterator[tuple[int, torch.Tensor]]:
        pos = 0
        for part, block in self.chunks(idx, device=device):
            yield pos, block
            pos += len(part)

    def dots(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
    ) -> torch.Tensor:
        cols, single = _as_columns(vectors, self.dim)
        device = cols[0].device
        idx = self._check_indices(indices)
        out = torch.empty(len(idx), len(cols), dtype=torch.float64, device=device)
        pos = 0
        for part, block in self.chunks(idx, device=device):
            for m, v in enumerate(cols):
                out[pos:pos + len(part), m] = torch.mv(block, v.to(torch.float32))
            pos += len(part)
        return out[:, 0] if single else out


class HadamardCanaries(CanarySet):
    """Canaries that are rows of a randomly signed Walsh-Hadamard matrix (see :class:`CanarySet`).

    Attributes:
        n: the transform length 2^floor(log2 dim) (:func:`hadamard_length`); the canaries
            live on coordinates ``0 .. n - 1``.
        rows: ``[num_canaries]`` int64, the row ``pi(j)`` of ``H D`` that canary j is.
        signs: ``[n]`` float32 +-1, the diagonal D.
    """

    kind = "hadamard"

    def __init__(self, seed: int, dim: int, num_canaries: int, *, kind: str | None = None) -> None:
        super().__init__(seed, dim, num_canaries, kind=kind)
        self.n = hadamard_length(self.dim)
        if self.num_canaries > self.n:
            raise ValueError(
                f"num_canaries: at most n = {self.n} Hadamard canaries exist for dim {self.dim}, "
                f"got {self.num_canaries}; use fewer canaries (num_canaries <= {self.n}), or "
                "canaries='gaussian' (kind='gaussian'), which has no such cap"
            )
        rng = np.random.default_rng([self.seed, 0x4AD])
        self.signs = torch.from_numpy(rng.integers(0, 2, self.n).astype(np.float32) * 2 - 1)
        # pi: k distinct rows in random order (the first k of a uniform random permutation)
        pi = rng.choice(self.n, size=self.num_canaries, replace=False)
        self._rows_host = np.asarray(pi, dtype=np.int64)  # pi on the host: rows picked without a device op
        self.rows = torch.from_numpy(self._rows_host)
        self.scale = 1.0 / math.sqrt(self.n)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._scaled_on: dict[tuple[torch.device, float, tuple[int, int] | None], torch.Tensor] = {}
        self._ones_on: dict[torch.device, torch.Tensor] = {}
        #: (device, b) -> the float32 and float64 buffers of :meth:`_gather`
        self._gather_on: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _device_parts(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(signs [n], rows [k]) on ``device`` (copied once per device)."""
        parts = self._on.get(device)
        if parts is None:
            parts = self._on[device] = (self.signs.to(device), self.rows.to(device))
        return parts

    def _scaled_signs(self, device: torch.device, scale: float = 1.0,
                      blocks: tuple[int, int] | None = None) -> torch.Tensor:
        """``signs * (scale / sqrt(n))`` ``[n]`` float32 on ``device`` (``blocks``: viewed as
        that 2-D shape), built once per device and ``scale`` (a few scales at most are kept: a
        run uses one canary norm), the view once too: each entry is ``+-float32(scale /
        sqrt(n))`` exactly, so ``v * (signs / sqrt(n))`` has the bits of ``(v * signs) * scale``.
        Shared, never modified."""
        key = (device, float(scale), blocks)
        scaled = self._scaled_on.get(key)
        if scaled is None:
            if len(self._scaled_on) >= 8:
                self._scaled_on.clear()
            if blocks is None:
                scaled = self._device_parts(device)[0] * (self.scale * float(scale))
            else:
                scaled = self._scaled_signs(device, scale).view(blocks)
            self._scaled_on[key] = scaled
        return scaled

    def _ones(self, device: torch.device, count: int) -> torch.Tensor:
        """``count`` ones, float32 on ``device``: a view of a cached vector, grown when a call
        has more indices than any before (repeated indices are allowed: a canary drawn in two
        accumulated batches appears twice)."""
        ones = self._ones_on.get(device)
        if ones is None or ones.numel() < count:
            size = max(count, self.num_canaries)
            ones = self._ones_on[device] = torch.ones(size, dtype=torch.float32, device=device)
        return ones[:count]

    def _host_rows(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``pi(j)`` for j in ``indices`` (a sequence or a numpy integer array), ``[b]`` int64 on
        the host. ``IndexError`` for an index outside ``[0, num_canaries)``."""
        if isinstance(indices, np.ndarray) and indices.dtype.kind in "iu":
            arr = indices.reshape(-1)
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.num_canaries):
                bad = int(arr[(arr < 0) | (arr >= self.num_canaries)][0])
                raise IndexError(f"canary index {bad} out of range [0, {self.num_canaries})")
            return self._rows_host[arr]
        return self._rows_host[np.asarray(self._check_indices(indices), dtype=np.int64)]

    def _selected_rows(self, indices: Sequence[int] | np.ndarray | None, device: torch.device) -> torch.Tensor:
        """``pi(j)`` for j in ``indices`` (default: all): ``[b]`` int64 on ``device``; a numpy
        integer array is checked and converted without a Python list. ``IndexError`` for an
        index outside ``[0, num_canaries)``."""
        rows = self._device_parts(device)[1]
        if indices is None:
            return rows
        if isinstance(indices, np.ndarray) and indices.dtype.kind in "iu":
            return rows[_index_array(indices, self.num_canaries, device)]
        return rows[_index_tensor(self._check_indices(indices), device)]

    def batch(
        self, indices: Sequence[int], *, scale: float = 1.0, device: torch.device | str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``scale * c_j`` for j in ``indices``: ``[len(indices), dim]`` float32 on ``device``
        (into ``out`` when given, as :meth:`CanarySet.batch`).

        All rows at once, without a loop over canaries: with L = 2^floor(log2(n) / 2) and a
        coordinate ``c = c_hi L + c_lo``, ``popcount(r & c) = popcount(r_hi & c_hi) +
        popcount(r_lo & c_lo)``, so row r of H is the outer product of a row of ``H_{n/L}`` and
        a row of ``H_L`` (each O(sqrt(n)), by parity), flattened: one O(k d) product.
        ``IndexError`` for an index outside ``[0, num_canaries)``."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        rows = self._host_rows(indices)
        b, d = rows.size, self.dim
        low_bits = (self.n.bit_length() - 1) // 2
        width = 1 << low_bits  # divides n: coordinates 0 .. n - 1 are n / L whole blocks
        high_len = self.n // width
        if out is None:
            out = torch.empty(b, d, dtype=torch.float32, device=dev)
        else:
            _check_out(out, b, d, dev)
        # out[:, :n] as [b, n / L, L] and out[:, n:], each by one as_strided (out is contiguous)
        if d > self.n:  # the first n coordinates are written below
            out.as_strided((b, d - self.n), (d, 1), out.storage_offset() + self.n).fill_(0.0)
        main = out.as_strided((b, high_len, width), (d, width, 1))
        if b == 1 and high_len <= _PARITY_TABLE_MAX and dev.type != "cpu":
            # one row on a GPU (the representative canary of a DP-FedAvg round): two rows of the
            # cached Sylvester matrices, as views, picked on the host (no copy to the device)
            r = int(rows[0])
            high = _hadamard_block(high_len, torch.float32, dev)[r >> low_bits].view(1, high_len, 1)
            low = _hadamard_block(width, torch.float32, dev)[r & (width - 1)].view(1, 1, width)
        elif high_len <= _PARITY_TABLE_MAX:
            # row r's high and low factors are rows r_hi and r_lo of the cached Sylvester matrix
            # H_{n/L} (n / L is L or 2 L; the first L entries of its row r_lo < L are row r_lo
            # of H_L): one [2b, n / L] gather, picked on the host on the CPU (no device op)
            picks = np.concatenate((rows >> low_bits, rows & (width - 1)))
            if dev.type == "cpu":
                both = torch.from_numpy(_hadamard_rows_host(high_len)[picks])
            else:
                both = torch.index_select(_hadamard_block(high_len, torch.float32, dev), 0, _host_index(picks, dev))
            high = both.as_strided((b, high_len, 1), (high_len, 1, 1))
            low = both.as_strided((b, 1, width), (high_len, width, 1), both.storage_offset() + b * high_len)
        else:
            r_dev = _host_index(rows, dev)
            low = _parity_signs(r_dev & (width - 1), width)[:, None, :]  # [b, 1, L]
            high = _parity_signs(r_dev >> low_bits, high_len)[:, :, None]  # [b, n / L, 1]
        torch.mul(high, low, out=main)
        main.mul_(self._scaled_signs(dev, scale, blocks=(high_len, width)))  # D's diagonal times the scale
        return out

    def sum(
        self, indices: Sequence[int] | None = None, *, weights: torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """``sum_j w_j c_j`` by one transform: ``D * FWHT(e)`` on the first n coordinates,
        ``e[pi(j)] = w_j`` (``indices``: a sequence or a numpy integer array)."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        if indices is None:
            r = self._device_parts(dev)[1]
        else:  # picked on the host: one index tensor, no gather on the device
            r = _host_index(self._host_rows(indices), dev)
        b = r.numel()
        e = torch.zeros(self.n, dtype=torch.float32, device=dev)
        w = self._ones(dev, b) if weights is None else weights[:b].to(device=dev, dtype=torch.float32)
        e.index_add_(0, r, w)
        out = torch.empty(self.dim, dtype=torch.float32, device=dev)
        if self.dim > self.n:
            out[self.n:].zero_()
        torch.mul(fwht(e), self._scaled_signs(dev), out=out[: self.n])
        return out

    def dots(
        self, vectors: torch.Tensor | Sequence[torch.Tensor], indices: Sequence[int] | None = None,
    ) -> torch.Tensor:
        cols, single = _as_columns(vectors, self.dim)
        device = cols[0].device
        signs = self._device_parts(device)[0]
        sel = self._selected_rows(indices, device)
        if len(cols) == 1:
            # one pass: D * v[:n] (the column of the general case, the same values), its
            # transform, and the gather from the transform's column as [n] (~4x faster than
            # from [n, 1] on the CPU): the bits of the general path in about a third of its ops
            v = cols[0]
            head = v.as_strided((self.n,), (v.stride(0),))  # v[:n] in one op
            y = _fwht_column(torch.mul(head if head.dtype == torch.float32 else head.to(torch.float32), signs),
                             owned=True)
            out = self._gather(y, sel)
            return out if single else out.unsqueeze(1)
        x = torch.zeros(self.n, len(cols), dtype=torch.float32, device=device)
        for m, v in enumerate(cols):
            x[:, m] = v[: self.n].to(torch.float32)
        x.mul_(signs.unsqueeze(1))
        y = fwht(x)
        out = torch.index_select(y, 0, sel).to(torch.float64).mul_(self.scale)  # y[sel], 3x faster
        return out[:, 0] if single else out

    def _gather(self, y: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        """``float64(y[sel]) * scale``, a new ``[b]`` float64 tensor (the bits of
        ``index_select(y, 0, sel).to(float64).mul_(scale)``) for ``y`` float32 contiguous, its
        entries in memory order the transform's column: ``torch.take`` into a reused float32
        buffer, a converting ``copy_`` into a reused float64 one, and one multiplication (3 ops
        where the conversion alone dispatches 4). The buffers are kept per device and b."""
        key = (y.device, sel.numel())
        bufs = self._gather_on.get(key)
        if bufs is None:
            if len(self._gather_on) >= 8:  # a few subsets at most: keep the cache small
                self._gather_on.clear()
            bufs = self._gather_on[key] = (torch.empty(key[1], dtype=torch.float32, device=y.device),
                                           torch.empty(key[1], dtype=torch.float64, device=y.device))
        picked, wide = bufs
        torch.take(y, sel, out=picked)
        wide.copy_(picked)
        return torch.mul(wide, self.scale)
