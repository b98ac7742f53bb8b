"""Binary encoding of a categorical domain, for the Fourier queries of Barak et al.

An attribute with ``s`` values becomes ``b = max(1, ceil(log2 s))`` binary attributes named
``"attr#0" .. "attr#{b-1}"``, most significant bit first, so that a code ``c`` is written
in binary over its bits. With this order the binary cell number of a record is the C-order
cell number over the padded shape ``(2^b_1, ..., 2^b_d)``: a histogram is re-encoded by
padding each axis with zeros. The codes ``s .. 2^b - 1`` are unused; the caller declares
the cells that use them structural zeros (Barak et al. §6, non-binary attributes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from dpopt.errors import DataError, DomainError, confidential_values
from dpopt.model.domain import Domain
from dpopt.model.queries._common import check_domain


def bits_needed(size: int) -> int:
    """Bits of the binary code of an attribute with ``size`` values (at least one)."""
    return max(1, (int(size) - 1).bit_length())


@dataclass(frozen=True)
class BinaryEncoding:
    """The binary re-encoding of a domain (see :func:`binary_encoding`).

    Attributes
    ----------
    source : Domain
        The categorical domain.
    domain : Domain
        The binary domain: every attribute of size 2.
    bits : mapping of str to tuple of str
        For each source attribute, its bit attributes, most significant first.
    unused_codes : mapping of str to tuple of int
        For each source attribute, the codes in ``size .. 2^b - 1`` no record can take.
    """

    source: Domain
    domain: Domain
    bits: Mapping[str, tuple[str, ...]]
    unused_codes: Mapping[str, tuple[int, ...]]

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """``(2^b_1, ..., 2^b_d)``: the source shape padded to whole bit patterns."""
        return tuple(2 ** len(self.bits[a]) for a in self.source.attrs)

    def _slices(self) -> tuple[slice, ...]:
        return tuple(slice(0, s) for s in self.source.sizes)

    def cell_map(self) -> np.ndarray:
        """The binary cell number of every source cell (C order), shape ``(source.size,)``."""
        self.domain.require_dense("the binary cell map")
        grid = np.arange(self.domain.size, dtype=np.int64).reshape(self.padded_shape)
        return grid[self._slices()].reshape(-1)

    def encode_histogram(self, x: np.ndarray) -> np.ndarray:
        """Counts over the binary domain: the source counts, zeros on unused codes.

        ``x`` has shape ``(source.size,)`` or ``(source.size, batch)``.
        """
        x = np.asarray(x)
        n = self.source.size
        if x.ndim not in (1, 2) or x.shape[0] != n:
            raise DataError(f"encode_histogram: expected {n} source counts, got shape {x.shape}")
        self.domain.require_dense("the binary histogram")
        batch = x.shape[1:]
        t = x.reshape(self.source.shape + batch)
        pad = [(0, p - s) for p, s in zip(self.padded_shape, self.source.sizes)] + [(0, 0)] * len(batch)
        return np.pad(t, pad).reshape((self.domain.size,) + batch)

    def decode_histogram(self, z: np.ndarray, check: bool = False) -> np.ndarray:
        """Source counts from binary counts (cells on unused codes are dropped).

        With ``check=True`` a non-zero count on an unused code raises :class:`DataError`.
        """
        z = np.asarray(z)
        n = self.domain.size
        if z.ndim not in (1, 2) or z.shape[0] != n:
            raise DataError(f"decode_histogram: expected {n} binary counts, got shape {z.shape}")
        batch = z.shape[1:]
        t = z.reshape(self.padded_shape + batch)
        if check:
            unused = self.structural_zero_mask()
            if np.any(z[unused] != 0):
                raise DataError("decode_histogram: non-zero counts on unused codes")
        return t[self._slices()].reshape((self.source.size,) + batch)

    def structural_zero_mask(self) -> np.ndarray:
        """True on the binary cells that use an unused code of some attribute."""
        self.domain.require_dense("the unused-code mask")
        d = len(self.source)
        valid = np.ones((1,) * d, dtype=bool)
        for i, (s, p) in enumerate(zip(self.source.sizes, self.padded_shape)):
            shape = [1] * d
            shape[i] = p
            valid = valid & (np.arange(p) < s).reshape(shape)
        return ~np.broadcast_to(valid, self.padded_shape).reshape(-1)

    def encode_codes(self, codes: np.ndarray) -> np.ndarray:
        """Records ``(n, d)`` of source codes as records ``(n, bits)`` of 0/1 codes."""
        codes = _check_codes(codes, self.source, "encode_codes")
        cols = []
        for i, a in enumerate(self.source.attrs):
            b = len(self.bits[a])
            shifts = np.arange(b - 1, -1, -1, dtype=np.int64)
            cols.append((codes[:, i : i + 1] >> shifts) & 1)
        return np.concatenate(cols, axis=1)

    def decode_codes(self, bits: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`encode_codes`; an unused code raises :class:`DataError`."""
        bits = _check_codes(bits, self.domain, "decode_codes")
        out = np.empty((bits.shape[0], len(self.source)), dtype=np.int64)
        start = 0
        for i, a in enumerate(self.source.attrs):
            b = len(self.bits[a])
            shifts = np.arange(b - 1, -1, -1, dtype=np.int64)
            out[:, i] = (bits[:, start : start + b] << shifts).sum(axis=1)
            start += b
            bad = out[:, i] >= self.source.sizes[i]
            if bad.any():
                raise DataError(f"decode_codes: records hold unused codes of attribute {a!r}"
                                + confidential_values(out[bad, i]))
        return out


    # ---- lifting queries and constraints to the binary domain --------------------------------
    def lift_matrix(self):
        """``P`` with ``P[s, cell_map[s]] = 1``: a source query ``Q`` is ``Q P`` on the binary cells."""
        import scipy.sparse as sp

        cell_map = self.cell_map()
        n = cell_map.size
        return sp.csr_matrix((np.ones(n, dtype=np.int64), (np.arange(n), cell_map)), shape=(n, self.domain.size))

    def lift_query(self, query):
        """A query of the source cells as the same query of the binary cells (zero on unused codes)."""
        from dpopt.model.queries.explicit import SparseQuery

        return SparseQuery(self.domain, query.to_sparse() @ self.lift_matrix())

    def lower_query(self, query):
        """A query of the binary cells as a query of the source cells (its columns at the used codes)."""
        from dpopt.model.queries.explicit import SparseQuery

        return SparseQuery(self.source, query.to_sparse().tocsc()[:, self.cell_map()].tocsr())

    def unused_code_zeros(self) -> list:
        """One structural-zero rule per attribute with unused codes (Barak et al. §6)."""
        from dpopt.model.constraints import StructuralZeros

        rules = []
        for a in self.source.attrs:
            codes = self.unused_codes[a]
            if codes:
                width = len(self.bits[a])
                cells = np.array([[(c >> (width - 1 - j)) & 1 for j in range(width)] for c in codes])
                rules.append(StructuralZeros(bits_predicate(self.bits[a], cells), name=f"unused codes of {a}",
                                             reason="binary encoding: codes beyond the attribute's size"))
        return rules

    def lift_constraints(self, constraints):
        """The constraints of the source domain over the binary domain, plus the unused-code zeros.

        Structural zeros and hierarchies become zero patterns of the bits; invariants and
        inequalities become the same rows on the binary cells (:meth:`lift_query`).
        Non-negativity and integrality are cell-wise and carry over as they are.
        """
        from dpopt.model.constraints import (
            ConstraintSet,
            Hierarchy,
            Integrality,
            Invariant,
            LinearInequality,
            NonNegativity,
            StructuralZeros,
        )

        if constraints.domain != self.source:
            raise DomainError(f"lift_constraints: the constraints are over {constraints.domain}, not {self.source}")
        cs = ConstraintSet(self.domain)
        for c in constraints:
            if isinstance(c, (StructuralZeros, Hierarchy)):
                attrs, mask = c.pattern(self.source)
                zero = np.flatnonzero(mask)
                if zero.size:
                    codes = self.source.project(attrs).unravel(zero)
                    bit_rows = np.concatenate(
                        [(codes[:, [j]] >> np.arange(len(self.bits[a]) - 1, -1, -1)) & 1 for j, a in enumerate(attrs)],
                        axis=1)
                    names = [b for a in attrs for b in self.bits[a]]
                    cs.add(StructuralZeros(bits_predicate(names, bit_rows), name=c.name, reason=getattr(c, "reason", "")))
            elif isinstance(c, Invariant):
                cs.add(Invariant(self.lift_query(c.query), c.values, name=c.name, from_data=c.from_data))
            elif isinstance(c, LinearInequality):
                cs.add(LinearInequality(self.lift_query(c.query), c.lower, c.upper, name=c.name))
            elif isinstance(c, (NonNegativity, Integrality)):
                cs.add(c)
        for rule in self.unused_code_zeros():
            cs.add(rule)
        return cs

    def source_marginal(self, attrs, binary_marginal: np.ndarray) -> np.ndarray:
        """A marginal over the bits of source ``attrs`` as a marginal over ``attrs`` (unused codes dropped)."""
        attrs = self.source.canonical(attrs)
        padded = tuple(2 ** len(self.bits[a]) for a in attrs)
        sizes = tuple(self.source.size_of(a) for a in attrs)
        return np.asarray(binary_marginal).reshape(padded)[tuple(slice(0, s) for s in sizes)].reshape(-1)


def bits_predicate(bit_names, patterns: np.ndarray) -> str:
    """A predicate true on the cells whose bits match one of ``patterns`` (rows of 0/1)."""
    terms = []
    for row in patterns:
        terms.append("(" + " and ".join(f"attr({b!r}) == {int(v)}" for b, v in zip(bit_names, row)) + ")")
    return " or ".join(terms)


def _check_codes(codes: np.ndarray, domain: Domain, who: str) -> np.ndarray:
    arr = np.asarray(codes)
    if arr.ndim != 2 or arr.shape[1] != len(domain):
        raise DataError(f"{who}: expected records of shape (n, {len(domain)}), got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"{who}: codes must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    for i, (a, s) in enumerate(zip(domain.attrs, domain.sizes)):
        bad = (arr[:, i] < 0) | (arr[:, i] >= s)
        if bad.any():
            raise DataError(f"{who}: column {a!r} holds codes outside 0..{s - 1}" + confidential_values(arr[bad, i]))
    return arr


def binary_encoding(domain: Domain) -> BinaryEncoding:
    """The binary domain of ``domain`` (``ceil(log2 size)`` bits per attribute, MSB first).

    Parameters
    ----------
    domain : Domain

    Returns
    -------
    BinaryEncoding
        With the binary ``domain``, the bit names per attribute, the unused codes per
        attribute (to declare as structural zeros) and the maps between histograms and
        records of the two domains.

    Examples
    --------
    >>> enc = binary_encoding(Domain.from_dict({"age": 3, "sex": 2}))
    >>> enc.domain.attrs, enc.unused_codes
    (('age#0', 'age#1', 'sex#0'), {'age': (3,), 'sex': ()})
    """
    check_domain(domain, "binary_encoding")
    names: list[str] = []
    bits: dict[str, tuple[str, ...]] = {}
    unused: dict[str, tuple[int, ...]] = {}
    for a, s in zip(domain.attrs, domain.sizes):
        b = bits_needed(s)
        bits[a] = tuple(f"{a}#{j}" for j in range(b))
        unused[a] = tuple(range(s, 2**b))
        names.extend(bits[a])
    clash = sorted(set(names) & set(domain.attrs))
    if clash or len(set(names)) != len(names):
        raise DomainError(
            f"binary_encoding: bit names {clash or sorted({n for n in names if names.count(n) > 1})} "
            "collide with attribute names; rename the attributes"
        )
    return BinaryEncoding(domain, Domain(tuple(names), (2,) * len(names)), bits, unused)
