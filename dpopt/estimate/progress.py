"""Progress of long solves, for whoever shows it (the release's progress bar).

A solve that takes minutes (the marginal-space projection on wide data: issue 27) reports each
certified point as one line, ``"ADMM: gap 3.1e-04 after 1,200 products"``, to the callable in
:data:`SOLVER_PROGRESS`, if any. The line holds the method, the relative duality gap and the
work done: figures of the noisy measurements' post-processing, never of the confidential data.
Between certified points, which can be minutes apart (ADMM checks every 100-300 steps: about
9 minutes on every triple of adult), the solver says how far it has gone,
``"ADMM: 1,220 products; last certified gap 3.1e-04"`` (:func:`report_work`).
"""

from __future__ import annotations

from contextvars import ContextVar
from collections.abc import Callable

__all__ = ["SOLVER_PROGRESS", "report_progress", "report_work"]

#: Receives one line per certified point of a long solve, and the work lines between them; None (the
#: default): nothing is reported.
#: ``dpopt run`` sets it to its progress bar's postfix for the algorithm's step.
SOLVER_PROGRESS: ContextVar[Callable[[str], None] | None] = ContextVar("dpopt_solver_progress", default=None)


def report_progress(method: str, products: int, gap: float) -> None:
    """Send ``method``'s certified ``gap`` after ``products`` products to :data:`SOLVER_PROGRESS`."""
    sink = SOLVER_PROGRESS.get()
    if sink is not None:
        sink(f"{method}: gap {gap:.1e} after {products:,} products")


def report_work(method: str, products: int, gap: float | None) -> None:
    """Send ``method``'s work between certified points to :data:`SOLVER_PROGRESS`: ``products`` so
    far and the last certified ``gap`` (None: no certified point yet)."""
    sink = SOLVER_PROGRESS.get()
    if sink is not None:
        last = "no certified point yet" if gap is None else f"last certified gap {gap:.1e}"
        sink(f"{method}: {products:,} products; {last}")
