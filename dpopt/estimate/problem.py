"""One consistency problem: measurements, constraints and an objective over one domain.

    minimise   loss(Q x - y)    subject to   x in constraints

with ``loss`` weighted by each measurement's noise: ``sum (r/sigma)^2`` (L2, generalised
least squares), ``sum |r|/sigma`` (L1), ``max |r|/sigma`` (L-infinity, Barak et al. 2007)
the entropy projection (multiplicative weights) or least squares plus a relative-entropy
penalty that follows the noise (``smooth``). This module holds the meaning; the
engines in this package compile it for the solver adapters in :mod:`dpopt.estimate.backends`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dpopt.errors import QueryError, SolverError
from dpopt.model.constraints import ConstraintSet, Invariant, require_domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity, Marginal, MarginalWorkload, Weighted

OBJECTIVES = ("l2", "l1", "linf", "entropy", "smooth")


def diagonal_of(query) -> np.ndarray | None:
    """The diagonal of a diagonal query (the identity, possibly with weighted rows), else None."""
    if isinstance(query, Identity):
        return np.ones(query.num_rows)
    if isinstance(query, Weighted) and isinstance(query.query, Identity):
        return np.broadcast_to(np.asarray(query.weights, dtype=np.float64), (query.num_rows,)).copy()
    return None


def unique_invariant_name(name: str, constraints: ConstraintSet) -> str:
    """``name``, or ``name`` with a suffix when the set already has an invariant of that name
    (a noise-free measurement labelled like a declared invariant)."""
    taken = {c.key for c in constraints.constraints}
    candidate, i = name, 1
    while f"invariant:{candidate}" in taken:
        i += 1
        candidate = f"{name} (measurement #{i})" if i > 2 else f"{name} (measurement)"
    return candidate


@dataclass
class ConsistencyProblem:
    """Measurements plus constraints plus an objective.

    Noise-free measurements (variance 0) are public exact values: they join the
    constraints as invariants rather than the loss.
    """

    measurements: Sequence[Measurement]
    constraints: ConstraintSet | None = None
    objective: str = "l2"
    noisy: list[Measurement] = field(init=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SolverError(f"unknown objective {self.objective!r}; choose one of {list(OBJECTIVES)}")
        ms = list(self.measurements)
        if not ms and self.constraints is None:
            raise QueryError("a consistency problem needs at least one measurement or constraint")
        domain = ms[0].domain if ms else self.constraints.domain
        for m in ms:
            if not isinstance(m, Measurement):
                raise QueryError(f"expected Measurement objects, got {type(m).__name__}")
            if m.domain != domain:
                raise QueryError(f"measurement {m.label!r} is over {m.domain}, not {domain}")
        cs = require_domain(self.constraints, domain)
        exact = [m for m in ms if m.variance == 0]
        if exact:
            cs = ConstraintSet(domain, list(cs.constraints))
            for m in exact:
                cs.add(Invariant(m.query, m.values, name=unique_invariant_name(m.label, cs)))
        self.constraints = cs
        self.measurements = ms
        self.noisy = [m for m in ms if m.variance > 0]
        self.domain = domain

    # ---- sizes and bounds --------------------------------------------------------------
    @property
    def num_cells(self) -> int:
        return self.domain.require_dense("a reconstruction over the full domain")

    @property
    def num_rows(self) -> int:
        return sum(m.query.num_rows for m in self.noisy)

    def cell_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-cell bounds from non-negativity and structural zeros."""
        n = self.num_cells
        lower = np.zeros(n) if self.constraints.nonnegative else np.full(n, -np.inf)
        upper = np.full(n, np.inf)
        if self.constraints.zero_rules:
            zero = self.constraints.zero_mask()
            lower[zero] = 0.0
            upper[zero] = 0.0
        return lower, upper

    def observes_every_cell(self) -> bool:
        """True when one noisy diagonal measurement (the identity) observes every free cell: the
        least-squares fit is then unique and every cell has a measured row of its own."""
        free = None
        for m in self.noisy:
            d = diagonal_of(m.query)
            if d is not None:
                free = self.free_cells() if free is None else free
                if np.all(d[free] != 0):
                    return True
        return False

    def free_cells(self) -> np.ndarray:
        """Indices of cells not pinned to zero."""
        lower, upper = self.cell_bounds()
        return np.flatnonzero(~((lower == 0) & (upper == 0)))

    # ---- stacked measurements ------------------------------------------------------------
    def sigmas(self) -> np.ndarray:
        """Noise standard deviation of every stacked row."""
        return np.concatenate([np.full(m.query.num_rows, m.stddev) for m in self.noisy]) if self.noisy else np.zeros(0)

    def targets(self) -> np.ndarray:
        return np.concatenate([m.values for m in self.noisy]) if self.noisy else np.zeros(0)

    def row_names(self) -> list[str]:
        return [f"measurement:{m.label}[{i}]" for m in self.noisy for i in range(m.query.num_rows)]

    def stacked_sparse(self) -> sp.csr_matrix:
        """All noisy measurement rows as one sparse matrix (small and medium problems)."""
        if not self.noisy:
            return sp.csr_matrix((0, self.num_cells))
        return sp.vstack([m.query.to_sparse() for m in self.noisy]).tocsr()

    def stacked_operator(self) -> LinearOperator:
        """All noisy measurement rows as a matrix-free operator (large problems).

        A workload made only of marginals runs as one :class:`MarginalWorkload` (all
        marginals from one Walsh–Hadamard transform on binary domains).
        """
        workload = self.marginal_workload()
        if workload is not None:
            return workload.as_linear_operator()
        sizes = [m.query.num_rows for m in self.noisy]
        splits = np.cumsum(sizes)[:-1]
        n = self.num_cells

        def matvec(v):
            v = np.ravel(v)
            return np.concatenate([m.query.matvec(v) for m in self.noisy])

        def rmatvec(u):
            parts = np.split(np.ravel(u), splits)
            out = np.zeros(n)
            for m, part in zip(self.noisy, parts):
                out += m.query.rmatvec(part)
            return out

        return LinearOperator((sum(sizes), n), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)

    def marginal_workload(self) -> MarginalWorkload | None:
        """All measured rows as one :class:`MarginalWorkload` when every query is a marginal."""
        if not self.noisy or not all(type(m.query) is Marginal for m in self.noisy):
            return None
        if getattr(self, "_workload", None) is None:  # built once: it precomputes index tables
            self._workload = MarginalWorkload(self.domain, [m.query.attrs for m in self.noisy])
        return self._workload

    def nnz_estimate(self) -> int:
        """Non-zeros of the stacked matrix, from the column norms (no matrix is built)."""
        total = 0
        for m in self.noisy:
            powers = m.query.column_norm_powers(1)
            per_col = float(np.mean(powers)) if np.ndim(powers) else float(powers)
            total += int(per_col * self.num_cells) + m.query.num_rows
        return total

    def total_estimate(self) -> float:
        """The table's total: an invariant if one fixes it, else an inverse-variance
        combination of the totals implied by measurements whose rows partition the cells."""
        return self.total_estimate_with_error()[0]

    def positive_total(self, objective: str) -> float:
        """:meth:`total_estimate`, refused (SolverError, naming ``objective``) when it is not
        positive: an objective over positive tables has no table with that total."""
        total = self.total_estimate()
        if total <= 0:
            raise SolverError(f"the {objective} objective needs a positive total, the measurements imply {total:g}")
        return total

    def total_estimate_with_error(self) -> tuple[float, float]:
        """:meth:`total_estimate` and its standard error (0 when an invariant fixes the total)."""
        for inv in self.constraints.invariants:
            coverage = inv.query.rmatvec(np.ones(inv.query.num_rows))
            if np.allclose(coverage, 1.0):
                return float(inv.values.sum()), 0.0
        estimates, weights = [], []
        for m in self.noisy:
            coverage = m.query.rmatvec(np.ones(m.query.num_rows))
            if np.allclose(coverage, coverage[0]) and coverage[0] > 0:
                estimates.append(m.values.sum() / coverage[0])
                weights.append(1.0 / (m.variance * m.query.num_rows / coverage[0] ** 2))
        if not estimates:
            raise SolverError(
                "this objective needs the table's total: declare an invariant on the total "
                "or measure a query whose rows cover every cell equally (a marginal or the total)"
            )
        return float(np.average(estimates, weights=weights)), float(1.0 / np.sqrt(np.sum(weights)))
