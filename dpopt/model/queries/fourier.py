"""Fourier (parity) queries over binary domains, after Barak et al., PODS 2007.

For ``k`` binary attributes a cell ``beta`` is a bit vector and the Fourier basis vector of a
parity ``alpha`` (a subset of the attributes) is ``f^alpha_beta = (-1)^<alpha, beta> / 2^{k/2}``
(Barak et al. §3); the basis is orthonormal. The unnormalised rows ``(-1)^<alpha, beta>``
are the rows of the Sylvester Hadamard matrix ``H_k``, so all ``2^k`` coefficients come from
one fast Walsh--Hadamard transform.

Bit-mask convention: the mask of a parity has bit ``k - 1 - i`` set when it contains the
``i``-th attribute (domain order), i.e. the mask is the cell number (C order) of the cell
whose attributes in ``alpha`` are 1 and the others 0. With this convention the WHT output at
index ``alpha`` is the coefficient of parity ``alpha``.
"""

from __future__ import annotations

from itertools import combinations
from typing import Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.errors import QueryError
from dpopt.model.domain import Domain
from dpopt.model.queries._common import (
    SupportArray,
    StructuredQuery,
    check_domain,
    expand,
    marginalize,
)

Parity = tuple[str, ...]


# ---- the transform ------------------------------------------------------------------------
def fast_walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """``H_k x`` for the Sylvester Hadamard matrix ``H_k[i, j] = (-1)^popcount(i & j)``.

    Vectorised in ``O(k 2^k)``: the vector is viewed as a tensor of shape ``(2,) * k`` and
    the 2x2 butterfly ``[[1, 1], [1, -1]]`` is applied along each axis in turn. ``H_k`` is
    symmetric and ``H_k H_k = 2^k I``, so the inverse transform is ``H_k y / 2^k``.

    Parameters
    ----------
    x : ndarray, shape (2**k,) or (2**k, batch)
        Not modified. Integer input gives integer output (exact); booleans count as 0/1.

    Returns
    -------
    ndarray of the same shape.
    """
    a = np.asarray(x)
    if a.ndim not in (1, 2):
        raise QueryError(f"fast_walsh_hadamard: x must have 1 or 2 dimensions, got shape {a.shape}")
    n = a.shape[0]
    if n < 1 or n & (n - 1):
        raise QueryError(f"fast_walsh_hadamard: the length {n} of x is not a power of two")
    if a.dtype == bool:
        a = a.astype(np.int64)
    k = n.bit_length() - 1
    cur = np.array(a, copy=True).reshape(n, -1)
    nxt = np.empty_like(cur)
    batch = cur.shape[1]
    for i in range(k):
        # Axis i of the (2,)*k tensor: blocks of 2**i, the pair axis, everything after it.
        src = cur.reshape(2**i, 2, (n >> (i + 1)) * batch)
        dst = nxt.reshape(src.shape)
        np.add(src[:, 0, :], src[:, 1, :], out=dst[:, 0, :])
        np.subtract(src[:, 0, :], src[:, 1, :], out=dst[:, 1, :])
        cur, nxt = nxt, cur
    return cur.reshape(a.shape)


# ---- parities --------------------------------------------------------------------------------
def require_binary(domain: Domain, who: str) -> None:
    """Raise unless every attribute of ``domain`` has exactly two values."""
    bad = [a for a, s in zip(domain.attrs, domain.sizes) if s != 2]
    if bad:
        raise QueryError(
            f"{who} needs binary attributes (size 2); {bad} are not: encode them with "
            "binary_encoding(domain) first"
        )


def parity_attrs(domain: Domain, subset: object, who: str = "parity") -> Parity:
    """A parity given as attribute names (any order) or a bit mask, as names in domain order."""
    if isinstance(subset, (int, np.integer)) and not isinstance(subset, bool):
        k, mask = len(domain), int(subset)
        if not 0 <= mask < 1 << k:
            raise QueryError(f"{who}: bit mask {mask} outside 0..2**{k}-1")
        return tuple(a for i, a in enumerate(domain.attrs) if (mask >> (k - 1 - i)) & 1)
    if isinstance(subset, str):
        subset = (subset,)
    try:
        names = tuple(subset)  # type: ignore[arg-type]
    except TypeError:
        raise QueryError(
            f"{who}: expected attribute names or a bit mask, got {subset!r}"
        ) from None
    for a in names:
        if not isinstance(a, str):
            raise QueryError(f"{who}: attribute names must be strings, got {a!r} in {names!r}")
    domain.check_attrs(names)
    return domain.canonical(names)


def parity_mask(domain: Domain, attrs: Iterable[str], within: Sequence[str] | None = None) -> int:
    """Bit mask of a parity over ``within`` (default: the whole domain), first attribute highest."""
    within = domain.attrs if within is None else tuple(within)
    k = len(within)
    return sum(1 << (k - 1 - within.index(a)) for a in attrs)


def _parity_text(attrs: Parity) -> str:
    return "parity {" + ",".join(attrs) + "}"


class FourierParity(StructuredQuery):
    """Parity (Fourier) queries ``<f^alpha, x>`` over a binary domain (Barak et al. 2007).

    Row ``alpha`` has entries ``(-1)^<alpha, beta>`` (unnormalised: integers, so integer
    answers on integer data, measurable with exact discrete noise) or
    ``(-1)^<alpha, beta> / 2^{k/2}`` with ``normalized=True`` (the orthonormal basis of the
    paper). Every entry has the same magnitude, so every column has L1 norm
    ``m * scale`` and squared L2 norm ``m * scale^2`` for ``m`` parities.

    Parameters
    ----------
    domain : Domain
        Every attribute of size 2 (see :func:`~dpopt.model.queries.binary.binary_encoding`).
    subsets : iterable
        One parity per row: a tuple of attribute names (any order; ``()`` is the total) or a
        bit mask (see the module notes for the bit order). No parity may repeat.
    normalized : bool
        Divide by ``2^{k/2}`` (``k`` the number of attributes of ``domain``).
    """

    def __init__(self, domain: Domain, subsets: Iterable, normalized: bool = False) -> None:
        self.domain = check_domain(domain, "FourierParity")
        require_binary(self.domain, "FourierParity")
        if isinstance(subsets, (str, int, np.integer)):
            raise QueryError(
                f"FourierParity: subsets must be a list of parities, got {subsets!r}"
            )
        parities: list[Parity] = []
        seen: dict[Parity, int] = {}
        for i, s in enumerate(subsets):
            p = parity_attrs(self.domain, s, f"FourierParity: parity #{i}")
            if p in seen:
                raise QueryError(
                    f"FourierParity: {_parity_text(p)} is listed twice (#{seen[p]} and #{i})"
                )
            seen[p] = i
            parities.append(p)
        if not parities:
            raise QueryError("FourierParity: subsets is empty")
        self.subsets: tuple[Parity, ...] = tuple(parities)
        self.normalized = bool(normalized)
        self.scale = 2.0 ** (-len(self.domain) / 2) if self.normalized else 1.0
        self.is_integer = not self.normalized
        used = {a for p in parities for a in p}
        self._union: tuple[str, ...] = tuple(a for a in self.domain.attrs if a in used)
        # Row masks over the union of the parities (the transform runs on that marginal).
        self._union_masks = np.array(
            [parity_mask(self.domain, p, self._union) for p in parities], dtype=np.int64
        ) if len(self._union) < 63 else None

    @property
    def num_rows(self) -> int:
        return len(self.subsets)

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self._union

    def _restrict_to(self, attrs: tuple[str, ...]) -> StructuredQuery:
        inner = FourierParity(self.domain.project(attrs), self.subsets)
        if not self.normalized:
            return inner
        from dpopt.model.queries.combine import Weighted

        # The scale stays 2^{-k/2} for the k attributes of the original domain.
        return Weighted(inner, self.scale)

    def masks(self) -> np.ndarray:
        """Bit masks of the rows over the whole domain (needs ``k <= 62``)."""
        if len(self.domain) > 62:
            raise QueryError(f"FourierParity: {len(self.domain)} attributes do not fit int64 masks")
        return np.array([parity_mask(self.domain, p) for p in self.subsets], dtype=np.int64)

    # ---- products ---------------------------------------------------------------------
    def _matvec(self, x: np.ndarray) -> np.ndarray:
        k, n, u = len(self.domain), self.domain.size, len(self._union)
        # One transform of the marginal over the union, or one marginal per parity.
        cost_transform = (n if u < k else 0) + u * 2**u
        cost_each = self.num_rows * n
        if cost_each < cost_transform:
            out = np.stack(
                [
                    fast_walsh_hadamard(marginalize(x, self.domain, p))[-1]
                    for p in self.subsets
                ]
            )
        else:
            coeffs = fast_walsh_hadamard(marginalize(x, self.domain, self._union))
            out = coeffs[self._union_masks]
        return out * self.scale if self.normalized else out

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        # Q^T y = H (y scattered at the parities' masks), since H is symmetric; the rows depend
        # only on the union's bits, so one transform over the union and a broadcast suffice.
        y = np.asarray(y)
        self.domain.require_dense("the transpose of a parity query")
        u = len(self._union)
        coeffs = np.zeros(2**u, dtype=np.result_type(y.dtype, np.int64))
        coeffs[self._union_masks] = y
        out = expand(fast_walsh_hadamard(coeffs), self.domain, self._union)
        return out * self.scale if self.normalized else out

    @property
    def fast_weighted_gram(self) -> bool:  # type: ignore[override]
        return self._union_masks is not None

    def _weighted_gram(self, v: np.ndarray) -> np.ndarray:
        # sum_j v_j chi_S(j) chi_T(j) = sum_j v_j chi_{S xor T}(j): one transform of v's
        # marginal over the union gives every entry.
        if self._union_masks is None:
            return super()._weighted_gram(v)
        coeffs = fast_walsh_hadamard(marginalize(v, self.domain, self._union))
        gram = coeffs[self._union_masks[:, None] ^ self._union_masks[None, :]]
        return gram * self.scale**2 if self.normalized else gram

    def columns(self, cells: np.ndarray) -> sp.csc_matrix:
        """The columns at ``cells``: ``(-1)^popcount(alpha & j)`` (times the scale), no full matrix.

        Column generation over cells (Barak et al. §4 LP on large domains) asks for a few
        thousand columns of a ``2^k``-column matrix; each entry is one popcount.
        """
        cells = np.asarray(cells, dtype=np.int64).ravel()
        n = self.domain.size
        if cells.size and (cells.min() < 0 or cells.max() >= n):
            raise QueryError(f"{self.name}.columns: cell numbers must lie in 0..{n - 1}")
        m = self.num_rows
        # Column-major entries: the CSC arrays are written directly (every entry is non-zero).
        masks = getattr(self, "_full_masks", None)
        if masks is None:  # cached: column generation asks for columns every round
            masks = self._full_masks = self.masks()
        odd = np.bitwise_count(cells[:, None] & masks[None, :]) & 1
        if self.normalized:
            data = ((1.0 - 2.0 * odd) * self.scale).ravel()
        else:
            data = (1 - 2 * odd.astype(np.int64)).ravel()
        indices = np.tile(np.arange(m, dtype=np.int32 if m < 2**31 else np.int64), cells.size)
        indptr = np.arange(0, m * cells.size + 1, m, dtype=np.int64)
        return sp.csc_matrix((data, indices, indptr), shape=(m, cells.size))

    def to_sparse(self) -> sp.csr_matrix:
        n = self.domain.require_dense("the parity matrix")
        cells = np.arange(n, dtype=np.int64)
        odd = np.bitwise_count(self.masks()[:, None] & cells[None, :]) & 1
        return sp.csr_matrix((1.0 - 2.0 * odd) * self.scale)

    # ---- norms ------------------------------------------------------------------------
    def _abs_power_rmatvec(self, v: np.ndarray, p: float) -> SupportArray:
        return (), np.asarray(float(np.sum(v)) * self.scale**p)

    def _support_norm_powers(self, p: float) -> SupportArray:
        return (), np.asarray(self.num_rows * self.scale**p)

    def _max_column_norm_power(self, p: float) -> float:
        return float(self.num_rows * self.scale**p)

    # ---- description ------------------------------------------------------------------
    def row_labels(self) -> list[str]:
        return [_parity_text(p) for p in self.subsets]

    def coefficient_map(self, values: np.ndarray) -> dict[Parity, float]:
        """``{parity: value}`` for answers ``values`` of this query (for :func:`marginal_from_fourier`)."""
        values = np.asarray(values)
        if values.shape != (self.num_rows,):
            raise QueryError(
                f"coefficient_map: expected {self.num_rows} values, got shape {values.shape}"
            )
        return dict(zip(self.subsets, values.tolist()))


# ---- closure and reconstruction -------------------------------------------------------
def downward_closure(subsets: Iterable, domain: Domain | None = None) -> list[tuple]:
    """Every ``alpha`` with ``alpha ⪯ beta`` for some ``beta`` in ``subsets`` (the set ``B``).

    The marginal ``C^beta x`` is determined by the coefficients of the parities below
    ``beta`` (Barak et al. Theorem 3), so releasing the marginals ``A`` needs the Fourier
    coefficients of the downward closure of ``A``; the empty parity is always included.

    Parameters
    ----------
    subsets : iterable of tuples of attribute names (or of bit masks, with ``domain``)
    domain : Domain, optional
        When given, subsets are validated and every result is in domain order.

    Returns
    -------
    list of tuples, by size then order of first appearance (domain order with ``domain``).
    """
    if isinstance(subsets, (str, int, np.integer)):
        raise QueryError(f"downward_closure: subsets must be a list of subsets, got {subsets!r}")
    out: dict[frozenset, tuple] = {}
    for i, beta in enumerate(subsets):
        if domain is not None:
            beta = parity_attrs(domain, beta, f"downward_closure: subset #{i}")
        elif isinstance(beta, (int, np.integer)):
            raise QueryError(f"downward_closure: subset #{i} is a bit mask {beta!r}; pass the domain")
        else:
            beta = (beta,) if isinstance(beta, str) else tuple(beta)
            if len(set(beta)) != len(beta):
                raise QueryError(f"downward_closure: subset #{i} {beta!r} names an attribute twice")
        for r in range(len(beta) + 1):
            for alpha in combinations(beta, r):
                out.setdefault(frozenset(alpha), alpha)
    if not out:
        out[frozenset()] = ()
    result = list(out.values())
    if domain is not None:
        return sorted(result, key=lambda a: (len(a), domain.axes(a)))
    return sorted(result, key=len)


def marginal_from_fourier(
    domain: Domain,
    attrs: Iterable[str],
    coefficients: Mapping,
    normalized: bool = False,
) -> np.ndarray:
    """The marginal ``C^beta x`` from the Fourier coefficients of the parities ``alpha ⪯ beta``.

    Barak et al. (PODS 2007) Theorem 3 / Eq. 5: ``C^beta x = sum_{alpha ⪯ beta}
    <f^alpha, x> C^beta f^alpha``, and ``C^beta f^alpha`` is ``2^{k - |beta|} / 2^{k/2}``
    times the parity ``alpha`` over the cells of the marginal. With unnormalised
    coefficients ``u_alpha = 2^{k/2} <f^alpha, x>`` this is the inverse Walsh--Hadamard
    transform ``H_{|beta|} u / 2^{|beta|}`` over the marginal's cells.

    Parameters
    ----------
    domain : Domain
        Binary.
    attrs : iterable of str
        The marginal ``beta``; the result follows C order over ``domain.project`` of it in
        domain order (as :class:`~dpopt.model.queries.marginal.Marginal`).
    coefficients : mapping
        Parity (tuple of names, any order, or bit mask) to coefficient; every ``alpha ⪯ beta``
        must be present (others are ignored).
    normalized : bool
        True when the coefficients are ``<f^alpha, x>`` with the ``1/2^{k/2}`` factor.

    Returns
    -------
    ndarray of float, shape (2**|beta|,)
    """
    check_domain(domain, "marginal_from_fourier")
    require_binary(domain, "marginal_from_fourier")
    if isinstance(attrs, str):
        attrs = (attrs,)
    beta = domain.canonical(attrs)
    if not beta:
        raise QueryError("marginal_from_fourier: attrs is empty")
    if not isinstance(coefficients, Mapping):
        raise QueryError(
            f"marginal_from_fourier: coefficients must be a mapping parity -> value, "
            f"got {type(coefficients).__name__}"
        )
    # Keys are normalised to sets of names without validating the ones that are not needed.
    given: dict[frozenset, float] = {}
    for key, value in coefficients.items():
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            names = frozenset(parity_attrs(domain, key, f"marginal_from_fourier: coefficient key {key!r}"))
        elif isinstance(key, str):
            names = frozenset((key,))
        else:
            try:
                names = frozenset(key)
            except TypeError:
                raise QueryError(f"marginal_from_fourier: coefficient key {key!r} is not a parity") from None
        if names in given and given[names] != value:
            raise QueryError(
                f"marginal_from_fourier: {_parity_text(domain.canonical(names))} given twice with different values"
            )
        given[names] = value
    u = len(beta)
    coeffs = np.zeros(2**u)
    for r in range(u + 1):
        for alpha in combinations(beta, r):
            value = given.get(frozenset(alpha))
            if value is None:
                raise QueryError(
                    f"marginal_from_fourier: the coefficient of {_parity_text(alpha)} is missing "
                    f"(every parity below {list(beta)} is needed)"
                )
            coeffs[parity_mask(domain, alpha, beta)] = value
    if normalized:
        coeffs = coeffs * 2.0 ** (len(domain) / 2)
    return fast_walsh_hadamard(coeffs) / 2.0**u
