"""Marginals of binary data in bulk: every cell of every ``k``-way marginal (``k <= 3``).

The combinatorics the factored estimates and their data side share: the ``k``-subsets of the
attributes in ``all_marginals`` order, the inclusion-exclusion matrix from subset moments
``E[prod_{l in T} x_l]`` to cells, the superset-sum (zeta) transform of a binary table, and the
data's counts from matrix products of the 0/1 record matrix
(:meth:`dpopt.model.data.Dataset.binary_marginal_counts`).
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import TYPE_CHECKING

import numpy as np

from dpopt.errors import DomainError, QueryError
from dpopt.model.domain import Domain

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.model.data import Dataset

__all__ = ["attribute_combinations", "inclusion_exclusion_matrix", "cells_from_subset_moments", "superset_sums", "subset_sums",
           "binary_marginal_counts", "require_binary", "check_ways"]

#: Bytes of one chunk of the 0/1 record matrix when the data's answers are computed.
CHUNK_BYTES = 2**26


def attribute_combinations(d: int, k: int) -> np.ndarray:
    """All ``k``-subsets of ``range(d)`` as rows, in lexicographic order (``itertools.combinations``)."""
    if k == 1:
        return np.arange(d, dtype=np.int64)[:, None]
    if k == 2:
        i, j = np.triu_indices(d, 1)
        return np.stack([i, j], axis=1).astype(np.int64)
    if k == 3:
        parts = []
        for i in range(d - 2):
            j, l = np.triu_indices(d - i - 1, 1)
            parts.append(np.stack([np.full(j.size, i), j + i + 1, l + i + 1], axis=1))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, 3), dtype=np.int64)
    return np.array(list(combinations(range(d), k)), dtype=np.int64).reshape(-1, k)


def inclusion_exclusion_matrix(k: int) -> np.ndarray:
    """``E`` with ``cells = subset_moments @ E.T`` for a ``k``-way binary marginal.

    Cell ``a`` and subset ``T`` are ``k``-bit masks, bit ``k-1-l`` for the ``l``-th attribute
    (C order: the first attribute most significant). ``P(x = a) = sum_{T ⊇ a} (-1)^{|T \\ a|}
    E[prod_{l in T} x_l]`` (inclusion-exclusion over the attributes set to 0).
    """
    masks = np.arange(2**k)
    a, t = masks[:, None], masks[None, :]
    sign = 1 - 2 * (np.vectorize(lambda v: bin(v).count("1"))(a ^ t) % 2)
    return np.where((a & t) == a, sign, 0).astype(np.float64)


def cells_from_subset_moments(moments: np.ndarray) -> np.ndarray:
    """All cells of binary marginals from their subset moments (rows: marginals, columns: masks)."""
    moments = np.asarray(moments, dtype=np.float64)
    k = int(round(math.log2(moments.shape[1])))
    return moments @ inclusion_exclusion_matrix(k).T


def superset_sums(table: np.ndarray) -> np.ndarray:
    """All moments of a binary probability table at once: ``Z[T] = E[prod_{l in T} x_l]``.

    ``T`` is a flat C-order index read as a bit mask (bit ``s-1-l`` for axis ``l``); ``Z`` is
    the superset-sum (zeta) transform ``Z[T] = sum_{x ⊇ T} P(x)``, ``s`` butterfly passes of
    ``2^(s-1)`` additions each.
    """
    return _butterfly(table, into=0)


def subset_sums(table: np.ndarray) -> np.ndarray:
    """The dual (Möbius-free) transform of :func:`superset_sums`: ``out[S] = sum_{T ⊆ S} table[T]``,
    flat in the same bit order."""
    return _butterfly(table, into=1)


def _butterfly(table: np.ndarray, into: int) -> np.ndarray:
    """Per axis, add the half with bit ``1 - into`` onto the half with bit ``into`` (flat copy)."""
    z = np.array(table, dtype=np.float64).reshape(-1)
    for l in range(np.ndim(table)):
        view = z.reshape(2**l, 2, -1)
        view[:, into, :] += view[:, 1 - into, :]
    return z


def require_binary(domain: Domain, who: str) -> None:
    """DomainError naming the first attribute without exactly two values."""
    for a, s in zip(domain.attrs, domain.sizes):
        if s != 2:
            raise DomainError(f"{who} needs binary attributes; attribute {a!r} has {s} values")


def check_ways(ways, domain: Domain) -> int:
    """The order of a binary marginal workload: 1, 2 or 3, at most the number of attributes."""
    if isinstance(ways, bool) or not isinstance(ways, (int, np.integer)) or ways not in (1, 2, 3):
        raise QueryError(f"ways must be 1, 2 or 3, got ways={ways!r}")
    if ways > len(domain):
        raise QueryError(f"ways={ways} exceeds the {len(domain)} attributes of the domain")
    return int(ways)


def binary_marginal_counts(data: "Dataset", k: int, *, chunk_rows: int | None = None) -> np.ndarray:
    """Counts of every cell of every ``k``-way marginal of binary data, shape ``(M, 2^k)``.

    Rows follow :func:`attribute_combinations` (the order of
    ``all_marginals``), cells C order. The subset counts ``sum_r w_r prod_{l in T} x_rl``
    come from matrix products of the 0/1 record matrix ``X`` (``1^T X``, ``X^T W X``, and
    for triples ``X_i^T W X_i`` over the records with ``x_i = 1``), taken in row chunks;
    inclusion-exclusion turns them into cells. Unweighted chunks use float32 BLAS, exact
    for counts below ``2^24`` per chunk; weighted data uses float64 (exact below ``2^53``).

    Parameters
    ----------
    data : Dataset
        Binary attributes only.
    k : {1, 2, 3}
    chunk_rows : int, optional
        Records per chunk (default: chunks of about 64 MB).
    """
    require_binary(data.domain, "binary_marginal_counts")
    k = check_ways(k, data.domain)
    codes, weights = data.codes, data.weights
    rows_total, d = codes.shape
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_BYTES // (8 * d))
    chunk_rows = int(min(chunk_rows, 2**24 - 1))
    dtype = np.float32 if weights is None else np.float64
    first = np.zeros(d)
    second = np.zeros((d, d)) if k >= 2 else None
    third = [np.zeros((d - i - 1) * (d - i - 2) // 2) for i in range(d - 2)] if k == 3 else []
    upper = [np.triu_indices(d - i - 1, 1) for i in range(d - 2)] if k == 3 else []
    for start in range(0, rows_total, chunk_rows):
        x = codes[start:start + chunk_rows].astype(dtype)
        w = None if weights is None else weights[start:start + chunk_rows].astype(np.float64)
        xw = x if w is None else x * w[:, None]
        first += xw.sum(axis=0, dtype=np.float64)
        if second is not None:
            second += (xw.T @ x).astype(np.float64)
        on = np.ascontiguousarray(x.T) > 0 if k == 3 else None  # on[i]: the records with x_i = 1
        for i in range(d - 2 if k == 3 else 0):
            # Pair counts among the records with x_i = 1 are the triple counts (i, j, l), j, l > i.
            sub = x[on[i], i + 1:]
            subw = sub if w is None else sub * w[on[i]][:, None]
            third[i] += (subw.T @ sub).astype(np.float64)[upper[i]]
    combos = attribute_combinations(d, k)
    moments = np.empty((len(combos), 2**k))
    moments[:, 0] = float(data.total)
    for l in range(k):
        moments[:, 1 << (k - 1 - l)] = first[combos[:, l]]
    if k >= 2:
        for l, m in combinations(range(k), 2):
            moments[:, (1 << (k - 1 - l)) | (1 << (k - 1 - m))] = second[combos[:, l], combos[:, m]]
    if k == 3:
        moments[:, 7] = np.concatenate(third) if third else np.zeros(0)
    return cells_from_subset_moments(moments)
