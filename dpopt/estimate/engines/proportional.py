"""What the multiplicative-weights engines share: proportional fitting and the boost schedule.

Both :mod:`dpopt.estimate.engines.entropy` (a whole problem from the uniform table) and
:mod:`dpopt.estimate.engines.mw_step` (MWEM's warm-started passes) keep invariants by iterative
proportional fitting and let the update's step grow while the squared residual falls.

**Proportional fitting** (Deming and Stephan 1940; the Bregman projection for the KL
divergence, Csiszár 1975) rescales the cells of every row of a counting invariant so that
the row sums to its published value; cells outside every row keep their value. One sweep
over disjoint rows is an exact KL projection; several invariants need repeated sweeps.

**The boost schedule** multiplies the paper's step by ``boost``: after a pass that lowered
the squared residual the boost grows by half (up to ``max_boost``); a pass that raised it
is undone and the boost falls back by a factor 4 (never below 1, the paper's step, which
keeps the convergence guarantee of multiplicative weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpopt.errors import SolverError
from dpopt.model.queries.base import LinearQuery

__all__ = ["BoostSchedule", "CountingInvariant", "counting_invariant", "proportional_fit"]


@dataclass(frozen=True, eq=False)
class CountingInvariant:
    """A counting query with disjoint 0/1 rows, its published values and its cell coverage."""

    query: LinearQuery
    values: np.ndarray
    coverage: np.ndarray  # 1 on cells that lie in some row, 0 elsewhere


def counting_invariant(query: LinearQuery, values, who: str) -> CountingInvariant:
    """``query = values`` ready for proportional fitting, or a SolverError naming ``who``.

    Proportional fitting needs 0/1 entries with every cell in at most one row (totals,
    marginals, sums of cells).
    """
    coverage = query.rmatvec(np.ones(query.num_rows))
    l1, l2 = query.column_norm_powers(1), query.column_norm_powers(2)
    if not (query.is_integer and np.allclose(coverage, l1) and np.allclose(l1, l2) and np.all(coverage <= 1 + 1e-12)):
        raise SolverError(
            f"invariant {who}: multiplicative weights impose invariants by proportional fitting, which needs "
            "counting queries with disjoint rows (totals, marginals); use objective 'l2' or 'l1'"
        )
    return CountingInvariant(query, np.asarray(values, dtype=np.float64), coverage)


def proportional_fit(x: np.ndarray, invariants: Sequence[CountingInvariant], sweeps: int = 10) -> np.ndarray:
    """Iterative proportional fitting of ``x`` to every invariant (the KL projection).

    One sweep when there is a single invariant (exact), else ``sweeps`` sweeps.
    """
    for _ in range(sweeps if len(invariants) > 1 else 1):
        for inv in invariants:
            current = inv.query.matvec(x)
            ratio = np.divide(inv.values, current, out=np.zeros_like(current), where=current > 0)
            x = x * (inv.query.rmatvec(ratio) + (1.0 - inv.coverage))
    return x


class BoostSchedule:
    """The step multiplier of repeated multiplicative-weights passes (see the module notes).

    Use: ``accept(new_loss)`` after a pass; False means the pass overshot and must be
    undone (the boost has already been lowered).
    """

    GROWTH = 1.5
    SHRINK = 4.0

    def __init__(self, max_boost: float, loss: float) -> None:
        self.max_boost = float(max_boost)
        self.boost = 1.0
        self.loss = float(loss)

    def accept(self, new_loss: float) -> bool:
        """Record a pass's loss; returns False (and lowers the boost) when it must be undone."""
        if new_loss > self.loss + 1e-12 * abs(self.loss) and self.boost > 1.0:
            self.boost = max(1.0, self.boost / self.SHRINK)
            return False
        self.loss = float(new_loss)
        self.boost = min(self.boost * self.GROWTH, self.max_boost)
        return True
