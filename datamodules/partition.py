"""Client partitions of a training set for federated simulations (numpy only).

Both functions return a list with one ``int64`` index array per client. The arrays are
disjoint, sorted, and together cover ``range(num_examples)`` exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["dirichlet_partition", "iid_partition", "label_entropy"]


def _check_num_clients(num_clients: int, num_examples: int) -> None:
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)):
        raise TypeError(f"num_clients must be an int, got {type(num_clients).__name__}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_clients > num_examples:
        raise ValueError(
            f"num_clients={num_clients} is larger than the number of examples "
            f"({num_examples}); every client needs at least one example"
        )


def iid_partition(num_examples: int, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Split ``range(num_examples)`` uniformly at random into ``num_clients`` shards.

    Args:
        num_examples: size N of the training set.
        num_clients: number of clients K, ``1 <= K <= N``.
        seed: seed of the numpy generator (the split is a pure function of the arguments).

    Returns:
        K sorted ``int64`` index arrays; sizes are ``N // K`` or ``N // K + 1``.

    Raises:
        ValueError: ``num_examples < 1`` or ``num_clients`` outside ``[1, num_examples]``.
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    _check_num_clients(num_clients, num_examples)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_examples).astype(np.int64)
    return [np.sort(shard) for shard in np.array_split(perm, num_clients)]


def dirichlet_partition(
    labels: Sequence[int] | np.ndarray,
    num_clients: int,
    concentration: float,
    seed: int = 0,
    min_size: int = 1,
    max_retries: int = 1000,
) -> list[np.ndarray]:
    """Label-skewed split of Hsu, Qi & Brown (2019), "Measuring the effects of non-identical
    data distribution for federated visual classification".

    For each class ``c`` the indices of that class are shuffled and cut among the clients
    in proportions ``p_c ~ Dirichlet(concentration * ones(num_clients))``. Small
    ``concentration`` (e.g. 0.1) gives each client a few dominant classes; large values
    (e.g. 100) approach an IID split. The whole draw is repeated until every client holds
    at least ``min_size`` examples.

    Args:
        labels: integer class labels, shape [N].
        num_clients: number of clients K, ``1 <= K <= N``.
        concentration: Dirichlet parameter alpha > 0 (per client, per class).
        seed: seed of the numpy generator.
        min_size: smallest allowed client size (>= 0); ``K * min_size <= N``.
        max_retries: how many full re-draws to attempt before giving up.

    Returns:
        K sorted ``int64`` index arrays into ``labels``, disjoint and covering ``range(N)``.

    Raises:
        ValueError: bad arguments, or no draw met ``min_size`` within ``max_retries``.
    """
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("labels is empty")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError("labels must be integers")
        y = y.astype(np.int64)
    n = int(y.size)
    _check_num_clients(num_clients, n)
    if not (isinstance(concentration, (int, float, np.floating)) and math.isfinite(concentration)):
        raise ValueError(f"concentration must be a finite number, got {concentration!r}")
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if min_size * num_clients > n:
        raise ValueError(
            f"min_size={min_size} for {num_clients} clients needs {min_size * num_clients} "
            f"examples but only {n} are available"
        )
    if max_retries < 1:
        raise ValueError(f"max_retries must be >= 1, got {max_retries}")

    rng = np.random.default_rng(seed)
    class_indices = [np.flatnonzero(y == c).astype(np.int64) for c in np.unique(y)]
    alpha = np.full(num_clients, float(concentration))
    smallest = -1
    for _ in range(max_retries):
        buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in class_indices:
            idx = rng.permutation(idx)
            proportions = rng.dirichlet(alpha)
            cuts = (np.cumsum(proportions)[:-1] * idx.size).astype(np.int64)
            for client, part in enumerate(np.split(idx, cuts)):
                buckets[client].append(part)
        parts = [np.sort(np.concatenate(b)) for b in buckets]
        smallest = min(p.size for p in parts)
        if smallest >= min_size:
            return parts
    raise ValueError(
        f"dirichlet_partition: no draw gave every one of {num_clients} clients at least "
        f"{min_size} examples in {max_retries} attempts (N={n}, concentration={concentration}, "
        f"smallest client in the last draw: {smallest}); use fewer clients, a larger "
        f"concentration, or a smaller min_size"
    )


def label_entropy(labels: Sequence[int] | np.ndarray, num_classes: int | None = None) -> float:
    """Shannon entropy (nats) of the empirical label distribution of ``labels`` [n].

    Handy to measure label skew: the mean over clients falls as the partition gets less IID.
    Returns 0.0 for an empty array.
    """
    y = np.asarray(labels, dtype=np.int64)
    if y.size == 0:
        return 0.0
    counts = np.bincount(y, minlength=num_classes or 0).astype(np.float64)
    p = counts[counts > 0] / y.size
    return float(-(p * np.log(p)).sum())
