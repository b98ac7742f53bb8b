"""The L2 engine: generalised least squares under the problem's constraints.

    minimise  sum_i ((Q x - y)_i / sigma_i)^2   subject to  constraints

The maximum-likelihood estimate under Gaussian noise and the best linear unbiased one
under any noise with these variances (Gauss–Markov; Li et al. 2015 use it to answer
workloads from a strategy's noisy answers). With only bounds (non-negativity, structural
zeros) it is a bounded least-squares problem, solved matrix-free when large; with
invariants or inequalities it is lifted to a sparse QP with one residual variable per
measured row, so that ``Q^T Q`` is never formed.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dpopt.estimate.backends import get_backend
from dpopt.estimate.form import LeastSquaresForm, ProgramForm
from dpopt.estimate.problem import ConsistencyProblem
from dpopt.estimate.result import Result, from_outcome

#: Above this many stacked non-zeros the bounded least-squares path goes matrix-free.
MATRIX_FREE_NNZ = 3_000_000


def solve_l2(problem: ConsistencyProblem, backend: str | None, time_limit=None, **options) -> Result:
    start = time.perf_counter()
    cs = problem.constraints
    free = problem.free_cells()
    lower, upper = problem.cell_bounds()
    sigma = problem.sigmas()
    y = problem.targets()
    general = bool(cs.invariants or cs.inequalities)
    if not general:
        # Explicit matrices go to an interior-point QP (cvxpy/Clarabel: fast and accurate);
        # only problems too large to hold explicitly go matrix-free to scipy's L-BFGS-B.
        matrix_free = problem.nnz_estimate() > MATRIX_FREE_NNZ
        name = backend or ("scipy" if matrix_free else "cvxpy")
        if matrix_free:
            M = _gathered_operator(problem.stacked_operator(), free)
        else:
            M = problem.stacked_sparse()[:, free]
        form = LeastSquaresForm(M, y, weights=1.0 / sigma, lower=lower[free], upper=upper[free])
    else:
        name = backend or "cvxpy"
        form = lifted_qp(problem, free, lower, upper, sigma, y)
    engine = get_backend(name)
    outcome = engine.solve(form, time_limit=time_limit, **options)
    x = None
    if outcome.x is not None:
        x = np.zeros(problem.num_cells)
        x[free] = outcome.x[: free.size]
    info = {"variables": int(free.size), "rows": int(sigma.size), "form": type(form).__name__}
    return from_outcome(outcome, x, objective="l2", problem=problem, time=time.perf_counter() - start, info=info)


def lifted_qp(problem, free, lower, upper, sigma, y) -> ProgramForm:
    """``min sum r_i^2 / sigma_i^2`` s.t. ``Q x - r = y``, invariants, inequalities, bounds."""
    cs = problem.constraints
    n, k = free.size, sigma.size
    Q = problem.stacked_sparse()[:, free]
    blocks = [sp.hstack([Q, -sp.identity(k, format="csr")])]
    lo, hi, names = [y], [y], problem.row_names()
    A_eq, b_eq, eq_names = cs.equality_rows()
    if A_eq.shape[0]:
        blocks.append(sp.hstack([A_eq[:, free], sp.csr_matrix((A_eq.shape[0], k))]))
        lo.append(b_eq), hi.append(b_eq), names.extend(f"invariant:{nm}" for nm in eq_names)
    A_in, l_in, u_in, in_names = cs.inequality_rows()
    if A_in.shape[0]:
        blocks.append(sp.hstack([A_in[:, free], sp.csr_matrix((A_in.shape[0], k))]))
        lo.append(l_in), hi.append(u_in), names.extend(f"inequality:{nm}" for nm in in_names)
    P = sp.diags(np.concatenate([np.zeros(n), 2.0 / sigma**2])).tocsc()
    return ProgramForm(
        c=np.zeros(n + k),
        A=sp.vstack(blocks).tocsr(),
        row_lower=np.concatenate(lo),
        row_upper=np.concatenate(hi),
        row_names=names,
        lower=np.concatenate([lower[free], np.full(k, -np.inf)]),
        upper=np.concatenate([upper[free], np.full(k, np.inf)]),
        P=P,
    )


def _gathered_operator(op: LinearOperator, free: np.ndarray) -> LinearOperator:
    """``op`` restricted to the columns ``free`` (pinned cells are dropped), matrix-free."""
    n = op.shape[1]
    if free.size == n:
        return op

    def matvec(v):
        full = np.zeros(n)
        full[free] = np.ravel(v)
        return op.matvec(full)

    return LinearOperator(
        (op.shape[0], free.size), matvec=matvec, rmatvec=lambda u: op.rmatvec(np.ravel(u))[free], dtype=np.float64
    )
