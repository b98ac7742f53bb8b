"""Benchmark of the solver adapters (prints figures). Run: /work/venv/bin/python bench_backends.py"""
import time
import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator
from dpopt.estimate.form import ProgramForm, LeastSquaresForm
from dpopt.estimate.backends import get_backend


def timed(label, fn):
    t = time.perf_counter(); out = fn(); dt = time.perf_counter() - t
    print(f"{label:60s} {dt:8.3f} s  {getattr(out, 'status', out)!s:28s} obj={getattr(out, 'objective', None)}")
    return out


def table_lp(r, c, seed=0):
    """L1 consistency of a noisy r×c table: min Σ|x - y| s.t. row/col sums = public, x ≥ 0 (LP, 3rc vars)."""
    rng = np.random.default_rng(seed)
    true = rng.poisson(20, size=(r, c)).astype(float)
    y = true.ravel() + rng.laplace(0, 2, size=r * c)
    n = r * c
    R = sp.kron(sp.eye_array(r), np.ones((1, c)))
    C = sp.kron(np.ones((1, r)), sp.eye_array(c))
    I = sp.eye_array(n)
    # variables (x, t): t ≥ |x - y|
    A = sp.vstack([sp.hstack([R, sp.csr_array((r, n))]), sp.hstack([C, sp.csr_array((c, n))]),
                   sp.hstack([I, -I]), sp.hstack([I, I])], format="csr")
    lo = np.r_[true.sum(1), true.sum(0), np.full(n, -np.inf), y]
    hi = np.r_[true.sum(1), true.sum(0), y, np.full(n, np.inf)]
    names = [f"invariant:rows[{i}]" for i in range(r)] + [f"invariant:cols[{j}]" for j in range(c)] + \
        [f"abs:upper[{i}]" for i in range(n)] + [f"abs:lower[{i}]" for i in range(n)]
    return ProgramForm(c=np.r_[np.zeros(n), np.ones(n)], A=A, row_lower=lo, row_upper=hi, row_names=names,
                       lower=np.r_[np.zeros(n), np.zeros(n)], upper=np.full(2 * n, np.inf))


def marginal_lsq(r, c, matrix_free, seed=0):
    """L2 consistency: identity + row and column sums of an r×c table, x ≥ 0."""
    rng = np.random.default_rng(seed)
    n = r * c
    true = rng.poisson(5, size=(r, c)).astype(float)
    y = np.r_[true.ravel() + rng.normal(0, 2, n), true.sum(1) + rng.normal(0, 2, r), true.sum(0) + rng.normal(0, 2, c)]
    if matrix_free:
        def mv(x):
            X = x.reshape(r, c); return np.r_[x, X.sum(1), X.sum(0)]
        def rmv(z):
            return (z[:n].reshape(r, c) + z[n:n + r][:, None] + z[n + r:][None, :]).ravel()
        M = LinearOperator((n + r + c, n), matvec=mv, rmatvec=rmv, dtype=float)
    else:
        M = sp.vstack([sp.eye_array(n), sp.kron(sp.eye_array(r), np.ones((1, c))),
                       sp.kron(np.ones((1, r)), sp.eye_array(c))], format="csr")
    return LeastSquaresForm(M=M, y=y, lower=0.0)


if __name__ == "__main__":
    f = table_lp(100, 100)
    print(f"L1 table LP 100x100: {f.num_vars} vars, {f.num_rows} rows, {f.A.nnz} nnz")
    for name in ("highs", "scipy", "cvxpy"):
        timed(f"  {name}", lambda: get_backend(name).solve(f))
    f = table_lp(30, 30)
    print(f"L1 table LP 30x30: {f.num_vars} vars, {f.num_rows} rows")
    for name in ("highs", "pulp"):
        timed(f"  {name}", lambda: get_backend(name).solve(f))
    f = table_lp(300, 300)
    print(f"L1 table LP 300x300: {f.num_vars} vars, {f.num_rows} rows, {f.A.nnz} nnz")
    timed("  highs", lambda: get_backend("highs").solve(f))
    # an infeasible one: column totals inconsistent with row totals
    f = table_lp(60, 60)
    lo, hi = f.row_lower.copy(), f.row_upper.copy()
    lo[60] += 5; hi[60] += 5
    g = ProgramForm(c=f.c, A=f.A, row_lower=lo, row_upper=hi, row_names=f.row_names, lower=f.lower, upper=f.upper)
    print(f"infeasible L1 table LP 60x60 ({g.num_rows} rows, {len(g.groups)} groups): solve + conflicts")
    out = timed("  highs solve (conflicts attached)", lambda: get_backend("highs").solve(g))
    print("    conflicting groups:", out.conflicting_rows)
    for r, c in ((100, 100), (300, 300), (1000, 1000)):
        for mf in (False, True):
            form = marginal_lsq(r, c, mf)
            for method in ("lsq_linear", "lbfgsb"):
                if r * c > 100_000 and method == "lsq_linear":
                    continue
                timed(f"L2 marginals {r}x{c} ({'operator' if mf else 'sparse'}) {method}",
                      lambda: get_backend("scipy").solve(form, method=method))
    form = marginal_lsq(100, 100, False)
    timed("L2 marginals 100x100 via HiGHS lifted QP", lambda: get_backend("highs").solve(form))
    timed("L2 marginals 100x100 via cvxpy lifted QP", lambda: get_backend("cvxpy").solve(form))
