"""Tests of the solver-adapter layer: forms, statuses, backends, conflicts, least squares.

Every installed backend is run on the same problems and checked against the others and
against closed forms or brute force (simplex projection, equality-constrained QP by its
KKT system, knapsack and small integer programs by enumeration, NNLS by scipy.optimize.nnls).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import nnls
from scipy.sparse.linalg import aslinearoperator

from dpopt.errors import SolverError
from dpopt.estimate.backends import (
    BACKENDS,
    available_backends,
    default_backend,
    find_conflicting_rows,
    get_backend,
    installed_backends,
)
from dpopt.estimate.form import FormError, LeastSquaresForm, ProgramForm, constraint_group
from dpopt.estimate.status import SolveOutcome, Status

INSTALLED = installed_backends()
REL = 1e-6


def backends_for(kind: str) -> list[str]:
    return [name for name in INSTALLED if kind in BACKENDS[name].kinds]


def rel_close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


# ---- problem generators ---------------------------------------------------------------------
def random_lp(seed: int = 0, n: int = 12, m: int = 9) -> ProgramForm:
    """A feasible, bounded LP with equality, ≥, ≤ and ranged rows and mixed bounds."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((m, n), density=0.5, rng=rng, format="csr") + sp.eye_array(m, n, format="csr")
    x0 = rng.uniform(0.2, 1.5, n)
    b = A @ x0
    row_lower = b.copy()
    row_upper = b.copy()
    row_upper[3:5] = np.inf                # ≥ rows
    row_lower[5:7] = -np.inf               # ≤ rows
    row_lower[7:] = b[7:] - 0.5            # ranged rows
    row_upper[7:] = b[7:] + 0.25
    lower = np.zeros(n)
    lower[0] = -3.0
    upper = np.full(n, 2.0)
    names = [f"eq[{i}]" for i in range(3)] + [f"ge[{i}]" for i in range(2)] + \
        [f"le[{i}]" for i in range(2)] + [f"range[{i}]" for i in range(m - 7)]
    return ProgramForm(c=rng.normal(size=n), A=A, row_lower=row_lower, row_upper=row_upper,
                       lower=lower, upper=upper, row_names=names, c0=1.25)


def random_qp(seed: int = 1) -> ProgramForm:
    """The random LP's constraints with a strictly convex quadratic objective."""
    lp = random_lp(seed)
    rng = np.random.default_rng(seed + 100)
    G = rng.normal(size=(lp.num_vars, lp.num_vars))
    P = sp.csc_array(G @ G.T / lp.num_vars + np.eye(lp.num_vars))
    return ProgramForm(c=3 * lp.c, A=lp.A, row_lower=lp.row_lower, row_upper=lp.row_upper,
                       lower=lp.lower, upper=lp.upper, row_names=lp.row_names, P=P, c0=-0.5)


def random_milp(seed: int = 2) -> ProgramForm:
    """A feasible MILP: 8 integer variables in [0, 3] and 4 continuous ones, integer data."""
    rng = np.random.default_rng(seed)
    n_int, n_cont, m = 8, 4, 6
    n = n_int + n_cont
    A = rng.integers(-3, 4, size=(m, n)).astype(float)
    x0 = np.r_[rng.integers(0, 4, n_int), rng.uniform(0, 2, n_cont)]
    b = A @ x0
    row_lower = np.r_[b[:2], b[2:4] - 2.0, np.full(2, -np.inf)]
    row_upper = np.r_[b[:2], np.full(2, np.inf), b[4:] + 1.5]
    return ProgramForm(c=rng.normal(size=n), A=A, row_lower=row_lower, row_upper=row_upper,
                       lower=np.zeros(n), upper=np.r_[np.full(n_int, 3.0), np.full(n_cont, 2.5)],
                       integrality=np.r_[np.ones(n_int, bool), np.zeros(n_cont, bool)],
                       row_names=[f"row[{i}]" for i in range(m)], c0=2.0)


def market_split(m: int = 5, seed: int = 1) -> ProgramForm:
    """Cornuéjols–Dawande market split with slacks: min Σ|s| s.t. a_i·x + s_i = ⌊Σa_i/2⌋, x binary.

    Hard for branch and bound (n = 10(m−1) = 40 binaries); always feasible.
    """
    rng = np.random.default_rng(seed)
    n = 10 * (m - 1)
    a = rng.integers(0, 100, size=(m, n)).astype(float)
    d = np.floor(a.sum(axis=1) / 2)
    A = sp.hstack([sp.csr_array(a), sp.eye_array(m), -sp.eye_array(m)], format="csr")
    return ProgramForm(c=np.r_[np.zeros(n), np.ones(2 * m)], A=A, row_lower=d, row_upper=d,
                       lower=np.zeros(n + 2 * m), upper=np.r_[np.ones(n), np.full(2 * m, np.inf)],
                       integrality=np.r_[np.ones(n, bool), np.zeros(2 * m, bool)],
                       row_names=[f"split[{i}]" for i in range(m)])


def infeasible_form(integer: bool = False, extra_groups: int = 0) -> ProgramForm:
    """Σx = 10 ("invariant:total") against x_i ≤ 2 ("upper:cap[i]") for 4 variables, plus
    harmless groups."""
    n = 4
    rows = [np.ones((1, n)), np.eye(n), np.array([[1.0, -1.0, 0.0, 0.0]])]
    lo = [[10.0], [-np.inf] * n, [-np.inf]]
    hi = [[10.0], [2.0] * n, [5.0]]
    names = ["invariant:total"] + [f"upper:cap[{i}]" for i in range(n)] + ["misc:diff"]
    for g in range(extra_groups):
        rows.append(np.eye(1, n, g % n))
        lo.append([-1.0 - g])
        hi.append([np.inf])
        names.append(f"extra:g{g}")
    return ProgramForm(c=np.ones(n), A=np.vstack(rows), row_lower=np.concatenate(lo),
                       row_upper=np.concatenate(hi), row_names=names,
                       integrality=np.ones(n, bool) if integer else None)


def check_solution(form: ProgramForm, out: SolveOutcome, tol: float = 1e-6) -> None:
    assert out.status is Status.OPTIMAL, out
    assert out.success and not out.incumbent
    assert out.x is not None and out.x.shape == (form.num_vars,)
    assert form.max_violation(out.x) <= tol * max(1.0, np.abs(out.x).max())
    assert rel_close(out.objective, form.objective(out.x))


# ---- agreement between backends -----------------------------------------------------------------
def test_registry_lists_every_backend():
    assert set(available_backends()) == {"highs", "scipy", "clarabel", "cvxpy", "pulp"}
    assert set(INSTALLED) <= set(available_backends())
    assert "highs" in INSTALLED and "scipy" in INSTALLED


def test_default_backend_by_kind():
    assert default_backend(random_lp()).name == "highs"
    assert default_backend(random_milp()).name == "highs"
    qp_default = next((name for name in ("clarabel", "cvxpy") if name in INSTALLED), "highs")
    assert default_backend(random_qp()).name == qp_default
    lsq = LeastSquaresForm(M=np.eye(2), y=np.ones(2))
    assert default_backend(lsq).name == "scipy"
    miqp = ProgramForm(c=[1.0], A=np.ones((1, 1)), row_lower=[0], row_upper=[1], row_names=["r"], P=np.eye(1),
                       integrality=[True])
    if not any(get_backend(name).supports(miqp) for name in INSTALLED):
        with pytest.raises(SolverError, match="no installed backend supports MIQP"):
            default_backend(miqp)


@pytest.mark.parametrize("seed", [0, 1])
def test_lp_backends_agree(seed):
    form = random_lp(seed)
    assert form.kind == "LP"
    outs = {name: get_backend(name).solve(form) for name in backends_for("LP")}
    assert len(outs) >= 2
    for out in outs.values():
        check_solution(form, out)
    ref = outs["highs"].objective
    for name, out in outs.items():
        assert rel_close(out.objective, ref), (name, out.objective, ref)
        assert out.backend == name


def test_lp_duals_are_shadow_prices():
    """row_duals = ∂ optimum / ∂ active row bound, checked by finite differences, for every backend."""
    form = random_lp(0)
    highs = get_backend("highs")
    base = highs.solve(form)
    duals = base.row_duals
    assert duals is not None and np.count_nonzero(np.abs(duals) > 1e-6) >= 3
    delta = 1e-4
    Ax = form.A @ base.x
    for i in np.flatnonzero(np.abs(duals) > 1e-6):
        at_lower = abs(Ax[i] - form.row_lower[i]) < 1e-7
        lo, hi = form.row_lower.copy(), form.row_upper.copy()
        if lo[i] == hi[i]:
            lo[i] += delta
            hi[i] += delta
        elif at_lower:
            lo[i] += delta
        else:
            hi[i] += delta
        moved = ProgramForm(c=form.c, A=form.A, row_lower=lo, row_upper=hi, lower=form.lower,
                            upper=form.upper, row_names=form.row_names, c0=form.c0)
        slope = (highs.solve(moved).objective - base.objective) / delta
        assert slope == pytest.approx(duals[i], rel=1e-4, abs=1e-6)
    for name in backends_for("LP"):
        out = get_backend(name).solve(form)
        assert out.row_duals is not None, name
        np.testing.assert_allclose(out.row_duals, duals, atol=1e-5, err_msg=name)


def test_qp_backends_agree_on_unique_solution():
    form = random_qp()
    assert form.kind == "QP"
    outs = {name: get_backend(name).solve(form) for name in backends_for("QP")}
    assert {"highs", "cvxpy"} <= set(outs)
    for out in outs.values():
        check_solution(form, out)
    ref = outs["highs"]
    for name, out in outs.items():
        assert rel_close(out.objective, ref.objective), name
        np.testing.assert_allclose(out.x, ref.x, atol=1e-6, err_msg=name)   # strictly convex: unique
        np.testing.assert_allclose(out.row_duals, ref.row_duals, atol=1e-5, err_msg=name)


def test_qp_equality_constrained_matches_kkt_solution():
    """min cᵀv + ½vᵀPv s.t. Av = b (no bounds): v and λ from the KKT system; duals = −λ."""
    rng = np.random.default_rng(5)
    n, m = 10, 4
    G = rng.normal(size=(n, n))
    P = G @ G.T + np.eye(n)
    A = rng.normal(size=(m, n))
    b, c = rng.normal(size=m), rng.normal(size=n)
    kkt = np.block([[P, A.T], [A, np.zeros((m, m))]])
    sol = np.linalg.solve(kkt, np.r_[-c, b])
    v, lam = sol[:n], sol[n:]
    form = ProgramForm(c=c, A=A, row_lower=b, row_upper=b, lower=np.full(n, -np.inf), upper=np.full(n, np.inf),
                       P=sp.csc_array(P), row_names=[f"eq[{i}]" for i in range(m)])
    for name in backends_for("QP"):
        out = get_backend(name).solve(form)
        check_solution(form, out)
        np.testing.assert_allclose(out.x, v, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(out.row_duals, -lam, atol=1e-6, err_msg=name)


def simplex_projection(z: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (Duchi et al., ICML 2008, Fig. 1)."""
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    rho = np.flatnonzero(u * np.arange(1, z.size + 1) > css - 1)[-1]
    theta = (css[rho] - 1) / (rho + 1)
    return np.maximum(z - theta, 0)


def test_qp_simplex_projection_closed_form():
    z = np.random.default_rng(7).normal(size=15)
    n = z.size
    form = ProgramForm(c=-z, P=sp.eye_array(n, format="csc"), c0=0.5 * z @ z, A=np.ones((1, n)),
                       row_lower=[1.0], row_upper=[1.0], row_names=["invariant:total"])
    expected = simplex_projection(z)
    for name in backends_for("QP"):
        out = get_backend(name).solve(form)
        check_solution(form, out)
        np.testing.assert_allclose(out.x, expected, atol=1e-6, err_msg=name)
        assert out.objective == pytest.approx(0.5 * np.sum((expected - z) ** 2), rel=1e-6, abs=1e-9)


def brute_force_integer(form: ProgramForm, values: np.ndarray) -> float:
    """Optimum of a pure-integer form by enumerating values^n (vectorised)."""
    grid = np.array(list(itertools.product(values, repeat=form.num_vars)), dtype=float)
    Ax = (form.A @ grid.T).T
    ok = np.all((Ax >= form.row_lower - 1e-9) & (Ax <= form.row_upper + 1e-9), axis=1)
    ok &= np.all((grid >= form.lower) & (grid <= form.upper), axis=1)
    return float(np.min(grid[ok] @ form.c) + form.c0)


def test_milp_backends_agree():
    form = random_milp()
    assert form.kind == "MILP"
    outs = {name: get_backend(name).solve(form) for name in backends_for("MILP")}
    assert len(outs) >= 3
    ref = outs["highs"].objective
    for name, out in outs.items():
        check_solution(form, out)
        assert rel_close(out.objective, ref), (name, out.objective, ref)
        assert out.row_duals is None


def test_pure_integer_program_matches_enumeration():
    rng = np.random.default_rng(11)
    n = 6
    A = rng.integers(-2, 3, size=(3, n)).astype(float)
    x0 = rng.integers(0, 3, n)
    form = ProgramForm(c=rng.normal(size=n), A=A, row_lower=A @ x0 - [0, 1, 2], row_upper=A @ x0 + [0, 2, 1],
                       lower=np.zeros(n), upper=np.full(n, 2.0), integrality=np.ones(n, bool),
                       row_names=["a", "b[0]", "b[1]"])
    expected = brute_force_integer(form, np.arange(3))
    for name in backends_for("MILP"):
        out = get_backend(name).solve(form)
        check_solution(form, out)
        assert rel_close(out.objective, expected), name


def knapsack(values, weights, capacity) -> ProgramForm:
    n = len(values)
    return ProgramForm(c=-np.asarray(values, float), A=np.asarray(weights, float)[None, :],
                       row_lower=[-np.inf], row_upper=[capacity], lower=np.zeros(n), upper=np.ones(n),
                       integrality=np.ones(n, bool), row_names=["capacity"])


def test_knapsack_known_optimum_and_enumeration():
    classic = knapsack([60, 100, 120], [10, 20, 30], 50)      # optimum 220: items 2 and 3
    rng = np.random.default_rng(3)
    random = knapsack(rng.integers(1, 50, 14), rng.integers(5, 40, 14), 120)
    random_opt = brute_force_integer(random, np.arange(2))
    for name in backends_for("MILP"):
        out = get_backend(name).solve(classic)
        check_solution(classic, out)
        assert out.objective == pytest.approx(-220.0)
        np.testing.assert_allclose(out.x, [0, 1, 1], atol=1e-6)
        assert get_backend(name).solve(random).objective == pytest.approx(random_opt, rel=REL)


def test_large_lp_through_interior_point_matches_closed_form():
    """min cᵀx s.t. Σx = k, 0 ≤ x ≤ 1: the k cheapest items. n > IPM_MIN_VARS selects IPM + crossover."""
    from dpopt.estimate.backends.highs import IPM_MIN_VARS

    n, k = IPM_MIN_VARS + 2000, 500
    c = np.random.default_rng(12).permutation(n) / n - 0.3      # distinct costs: unique optimum
    form = ProgramForm(c=c, A=sp.csr_array(np.ones((1, n))), row_lower=[k], row_upper=[k], row_names=["total"],
                       upper=np.ones(n))
    expected = np.sort(c)[:k].sum()
    for name in ("highs", "scipy"):
        out = get_backend(name).solve(form)
        check_solution(form, out)
        assert out.objective == pytest.approx(expected, rel=1e-9)
        # The dual of the total is the k-th cheapest cost (up to the gap to the next one).
        assert np.sort(c)[k - 1] - 1e-9 <= out.row_duals[0] <= np.sort(c)[k] + 1e-9


def test_form_without_rows():
    form = ProgramForm(c=[1.0, -2.0], A=sp.csr_array((0, 2)), row_lower=[], row_upper=[], row_names=[],
                       lower=[-1.0, -1.0], upper=[3.0, 4.0])
    for name in backends_for("LP"):
        out = get_backend(name).solve(form)
        check_solution(form, out)
        assert out.objective == pytest.approx(-9.0)


def test_form_without_variables():
    ok = ProgramForm(c=np.zeros(0), A=sp.csr_array((2, 0)), row_lower=[-1, 0], row_upper=[0, np.inf],
                     row_names=["a", "b"], c0=3.0)
    bad = ProgramForm(c=np.zeros(0), A=sp.csr_array((1, 0)), row_lower=[1], row_upper=[2], row_names=["a"])
    out = get_backend("highs").solve(ok)
    assert out.status is Status.OPTIMAL and out.objective == 3.0
    out = get_backend("highs").solve(bad)
    assert out.status is Status.INFEASIBLE and out.conflicting_rows == ["a"]


# ---- infeasible, unbounded, limits ----------------------------------------------------------------
@pytest.mark.parametrize("integer", [False, True])
def test_infeasible_status_and_conflicts_from_every_backend(integer):
    form = infeasible_form(integer=integer)
    for name in backends_for(form.kind):
        out = get_backend(name).solve(form)
        assert out.status is Status.INFEASIBLE, (name, out)
        assert not out.success and out.x is None and out.objective is None
        assert out.conflicting_rows == ["invariant:total", "upper:cap"], name


def test_conflicts_can_be_turned_off():
    out = get_backend("highs").solve(infeasible_form(), conflicts=False)
    assert out.status is Status.INFEASIBLE and out.conflicting_rows is None


@pytest.mark.parametrize("elastic", [False, True, None])
def test_find_conflicting_rows_filters(elastic):
    # 20 harmless groups: the default (None) uses the elastic filter above 16 groups.
    form = infeasible_form(extra_groups=20)
    assert len(form.groups) == 23
    for name in backends_for("LP"):
        assert find_conflicting_rows(form, name, elastic=elastic) == ["invariant:total", "upper:cap"], name


def test_find_conflicting_rows_names_bounds_and_returns_empty_when_feasible():
    negative_total = ProgramForm(c=np.ones(3), A=np.ones((1, 3)), row_lower=[-1.0], row_upper=[-1.0],
                                 row_names=["invariant:total"])                     # against v ≥ 0
    for elastic in (False, True):
        assert find_conflicting_rows(negative_total, "highs", elastic=elastic) == ["invariant:total", "bounds"]
    integral_gap = ProgramForm(c=[1.0], A=sp.csr_array((0, 1)), row_lower=[], row_upper=[], row_names=[],
                               lower=[0.2], upper=[0.8], integrality=[True])
    assert get_backend("highs").solve(integral_gap).conflicting_rows == ["bounds"]
    assert find_conflicting_rows(random_lp(0)) == []


def test_find_conflicting_rows_is_irreducible_on_random_forms():
    """Brute force over subsets of groups: the answer is infeasible and every proper subset feasible."""
    rng = np.random.default_rng(4)
    highs = get_backend("highs")
    n = 3
    for _ in range(4):
        k = 7
        A = rng.integers(-2, 3, size=(k, n)).astype(float)
        lo = rng.integers(-3, 4, size=k).astype(float)
        form = ProgramForm(c=np.zeros(n), A=A, row_lower=lo, row_upper=lo + rng.integers(0, 3, size=k),
                           lower=np.full(n, -2.0), upper=np.full(n, 2.0), row_names=[f"g{i}" for i in range(k)])
        if highs.solve(form).status is not Status.INFEASIBLE:
            continue
        found = find_conflicting_rows(form, highs)
        rows = [int(g[1:]) for g in found if g != "bounds"]
        drop = "bounds" not in found

        def feasible(subset):
            sub = form.restricted(np.isin(np.arange(k), subset), drop_bounds=drop)
            return highs.solve(sub, conflicts=False).status is Status.OPTIMAL

        assert not feasible(rows)
        for r in rows:
            assert feasible([q for q in rows if q != r])


@pytest.mark.parametrize("integer", [False, True])
def test_unbounded_status_from_every_backend(integer):
    form = ProgramForm(c=-np.ones(3), A=np.ones((1, 3)), row_lower=[1.0], row_upper=[np.inf],
                       row_names=["lower:total"], integrality=np.ones(3, bool) if integer else None)
    for name in backends_for(form.kind):
        out = get_backend(name).solve(form)
        assert out.status is Status.UNBOUNDED, (name, out)
        assert not out.success and out.x is None and out.conflicting_rows is None


def test_time_limit_on_hard_milp():
    form = market_split()
    for name in backends_for("MILP"):
        out = get_backend(name).solve(form, time_limit=0.05)
        assert out.status is Status.TIME_LIMIT, (name, out)
        assert not out.success
        if out.x is not None:                      # the incumbent, flagged as such
            assert out.incumbent
            assert form.max_violation(out.x) <= 1e-6
            assert out.objective == pytest.approx(form.objective(out.x), rel=1e-6, abs=1e-6)


# ---- options and errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", INSTALLED)
def test_unknown_option_lists_accepted_options(name):
    backend = get_backend(name)
    with pytest.raises(SolverError) as err:
        backend.solve(random_lp(), frobnicate=3)
    msg = str(err.value)
    assert "frobnicate" in msg and "accepted options" in msg
    for option in backend.accepted_options():
        assert option in msg


def test_unknown_backend_lists_installed():
    with pytest.raises(SolverError) as err:
        get_backend("gurobi")
    for name in INSTALLED:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [({"time_limit": -1}, "time_limit"), ({"time_limit": np.inf}, "time_limit"),
     ({"tolerance": 0}, "tolerance"), ({"tolerance": "tight"}, "tolerance"), ({"mip_gap": 2.0}, "mip_gap")],
)
def test_bad_option_values(kwargs, fragment):
    with pytest.raises(SolverError, match=fragment):
        get_backend("highs").solve(random_milp(), **kwargs)


def test_backend_specific_option_checks():
    with pytest.raises(SolverError, match="method"):
        get_backend("highs").solve(random_lp(), method="barrier")
    with pytest.raises(SolverError, match="rejected option"):
        get_backend("highs").solve(random_lp(), highs_options={"no_such_option": 1})
    with pytest.raises(SolverError, match="LeastSquaresForm"):
        get_backend("scipy").solve(random_lp(), method="lbfgsb")
    if "cvxpy" in INSTALLED:
        with pytest.raises(SolverError, match="not installed"):
            get_backend("cvxpy").solve(random_lp(), solver="NO_SUCH_SOLVER")
        out = get_backend("cvxpy").solve(random_lp(), solver="HIGHS")
        assert out.solver == "cvxpy/HIGHS" and out.success
    if "pulp" in INSTALLED:
        with pytest.raises(SolverError, match="threads"):
            get_backend("pulp").solve(random_milp(), threads=0)


def test_options_reach_the_solver():
    form = random_lp(1)
    ref = get_backend("highs").solve(form).objective
    for method in ("simplex", "ipm"):
        out = get_backend("highs").solve(form, method=method, presolve=False, tolerance=1e-9)
        assert out.success and rel_close(out.objective, ref)
    out = get_backend("scipy").solve(form, presolve=False, tolerance=1e-9)
    assert out.success and rel_close(out.objective, ref)
    if "cvxpy" in INSTALLED:
        out = get_backend("cvxpy").solve(form, tolerance=1e-10, solver_options={"max_iter": 200})
        assert out.success and rel_close(out.objective, ref, 1e-8)
        # An iteration cap of 1 stops CLARABEL early: ITERATION_LIMIT, not success.
        out = get_backend("cvxpy").solve(form, solver_options={"max_iter": 1})
        assert out.status is Status.ITERATION_LIMIT and not out.success
    if "clarabel" in INSTALLED:
        out = get_backend("clarabel").solve(form, tolerance=1e-10, solver_options={"max_iter": 200})
        assert out.success and rel_close(out.objective, ref, 1e-8)
        out = get_backend("clarabel").solve(form, solver_options={"max_iter": 1})
        assert out.status is Status.ITERATION_LIMIT and not out.success
        with pytest.raises(SolverError, match="unknown solver option 'no_such_setting'"):
            get_backend("clarabel").solve(form, solver_options={"no_such_setting": 1})


@pytest.mark.skipif(not {"clarabel", "cvxpy"} <= set(INSTALLED), reason="needs clarabel and cvxpy")
@pytest.mark.parametrize("make", [random_lp, random_qp])
def test_clarabel_direct_is_cvxpy_clarabel(make):
    """The direct adapter hands Clarabel the problem cvxpy's canonicalisation would: the same
    point, duals and iteration count as ``cvxpy`` with ``solver="CLARABEL"`` (to rounding)."""
    form = make()
    direct = get_backend("clarabel").solve(form)
    through = get_backend("cvxpy").solve(form, solver="CLARABEL")
    assert direct.success and through.success
    assert direct.iterations == through.iterations
    np.testing.assert_allclose(direct.x, through.x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(direct.row_duals, through.row_duals, rtol=1e-10, atol=1e-10)


def test_unsupported_kind_is_an_error():
    qp = random_qp()
    assert not get_backend("scipy").supports(qp)
    with pytest.raises(SolverError, match="does not support QP"):
        get_backend("scipy").solve(qp)
    miqp = ProgramForm(c=qp.c, A=qp.A, row_lower=qp.row_lower, row_upper=qp.row_upper, lower=qp.lower,
                       upper=qp.upper, P=qp.P, integrality=np.ones(qp.num_vars, bool), row_names=qp.row_names)
    assert miqp.kind == "MIQP"
    with pytest.raises(SolverError, match="MIQP"):
        get_backend("highs").solve(miqp)
    with pytest.raises(SolverError, match="form must be"):
        get_backend("highs").solve("not a form")


def test_solver_crash_raises_solver_error_naming_backend(monkeypatch):
    import highspy

    def broken_run(self):
        raise RuntimeError("segfault imitation")

    monkeypatch.setattr(highspy.Highs, "run", broken_run)
    with pytest.raises(SolverError, match="'highs' crashed: RuntimeError: segfault imitation"):
        get_backend("highs").solve(random_lp())


def test_status_success_only_for_optimal():
    """Only OPTIMAL is a solve's success; COMPLETED is an iterative algorithm's status (releasable,
    with OPTIMAL), never a solver's."""
    assert [s for s in Status if s.success] == [Status.OPTIMAL]
    assert [s for s in Status if s.releasable] == [Status.OPTIMAL, Status.COMPLETED]
    for name in available_backends():
        solver_statuses = set(BACKENDS[name].status_map.values())
        assert Status.COMPLETED not in solver_statuses, name
        assert [s for s in solver_statuses if s.success] == [Status.OPTIMAL], name


# ---- form validation ---------------------------------------------------------------------------------
def _lp_kwargs(**overrides):
    kwargs = dict(c=[1.0, 2.0], A=np.eye(2), row_lower=[0.0, 0.0], row_upper=[1.0, 1.0], row_names=["a", "b"])
    kwargs.update(overrides)
    return kwargs


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"c": [1.0, np.nan]}, "c"),
        ({"c": [1.0, np.inf]}, "c"),
        ({"A": np.eye(3)}, "A"),
        ({"A": np.array([[1.0, np.nan], [0.0, 1.0]])}, "A"),
        ({"row_lower": [0.0]}, "row_lower"),
        ({"row_upper": [1.0, np.nan]}, "row_upper"),
        ({"row_lower": [2.0, 0.0]}, "row_lower"),
        ({"row_upper": [-np.inf, 1.0]}, "row_upper"),
        ({"lower": [3.0, 0.0], "upper": [1.0, 1.0]}, "lower"),
        ({"upper": [1.0]}, "upper"),
        ({"P": np.array([[1.0, 1.0], [0.0, 1.0]])}, "P"),
        ({"P": np.eye(3)}, "P"),
        ({"integrality": [True]}, "integrality"),
        ({"integrality": [0, 2]}, "integrality"),
        ({"c0": np.inf}, "c0"),
        ({"row_names": ["a"]}, "row_names"),
        ({"var_names": ["x"]}, "var_names"),
    ],
)
def test_program_form_validation_names_the_field(overrides, field):
    with pytest.raises(FormError, match=field) as err:
        ProgramForm(**_lp_kwargs(**overrides))
    assert isinstance(err.value, SolverError) and isinstance(err.value, ValueError)


def test_program_form_kinds_and_groups():
    form = ProgramForm(**_lp_kwargs(row_names=["invariant:state_totals[3]", "upper:cap"]))
    assert form.kind == "LP" and form.num_vars == 2 and form.num_rows == 2
    assert form.groups == ["invariant:state_totals", "upper:cap"]
    assert constraint_group("invariant:state_totals[3]") == "invariant:state_totals"
    assert ProgramForm(**_lp_kwargs(P=np.eye(2))).kind == "QP"
    assert ProgramForm(**_lp_kwargs(integrality=[True, False])).kind == "MILP"
    assert ProgramForm(**_lp_kwargs(integrality=[False, False])).kind == "LP"
    assert ProgramForm(**_lp_kwargs(P=np.eye(2), integrality=[1, 0])).kind == "MIQP"
    form = ProgramForm(**_lp_kwargs())
    with pytest.raises(AttributeError):
        form.c0 = 1.0                                             # frozen
    with pytest.raises(ValueError):
        form.c[0] = 5.0                                           # read-only arrays


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"y": np.zeros(4)}, "y"),
        ({"y": np.array([1.0, np.nan, 0.0])}, "y"),
        ({"weights": [1.0, -1.0, 1.0]}, "weights"),
        ({"lower": [1.0, 1.0], "upper": [0.0, 2.0]}, "lower"),
        ({"M": np.ones(3)}, "M"),
        ({"M": np.array([[np.inf, 0.0], [0.0, 1.0], [1.0, 1.0]])}, "M"),
    ],
)
def test_least_squares_form_validation_names_the_field(overrides, field):
    kwargs = dict(M=np.ones((3, 2)), y=np.zeros(3))
    kwargs.update(overrides)
    with pytest.raises(FormError, match=field):
        LeastSquaresForm(**kwargs)


# ---- least squares ---------------------------------------------------------------------------------
def _nnls_case(seed: int, k: int = 40, n: int = 15):
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(k, n)) * rng.uniform(0.2, 5.0, n)
    y = 3 * rng.normal(size=k)
    w = rng.uniform(0.5, 2.0, k)
    x_ref, rnorm = nnls(w[:, None] * M, w * y)
    return M, y, w, x_ref, rnorm**2


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("matrix", ["dense", "sparse", "operator"])
@pytest.mark.parametrize("method", ["lsq_linear", "lbfgsb", "auto"])
def test_least_squares_agrees_with_nnls(seed, matrix, method):
    M, y, w, x_ref, f_ref = _nnls_case(seed)
    Mx = {"dense": M, "sparse": sp.csr_array(M), "operator": aslinearoperator(M)}[matrix]
    form = LeastSquaresForm(M=Mx, y=y, weights=w, lower=np.zeros(M.shape[1]))
    out = get_backend("scipy").solve(form, method=method)
    assert out.status is Status.OPTIMAL and out.success, out
    assert out.objective == pytest.approx(f_ref, rel=1e-9)
    assert out.objective == pytest.approx(form.objective(out.x), rel=1e-12)
    np.testing.assert_allclose(out.x, x_ref, atol=1e-6)
    assert out.x.min() >= 0


def test_least_squares_through_qp_backends_agrees_with_nnls():
    M, y, w, x_ref, f_ref = _nnls_case(3)
    form = LeastSquaresForm(M=sp.csr_array(M), y=y, weights=w, lower=np.zeros(M.shape[1]))
    for name in backends_for("QP"):
        out = get_backend(name).solve(form)
        assert out.success, (name, out)
        assert out.objective == pytest.approx(f_ref, rel=REL)
        np.testing.assert_allclose(out.x, x_ref, atol=1e-6, err_msg=name)
    assert not get_backend("pulp").supports(form) if "pulp" in INSTALLED else True
    operator_form = LeastSquaresForm(M=aslinearoperator(M), y=y)
    assert not get_backend("highs").supports(operator_form)


def test_least_squares_box_bounds_and_unbounded():
    rng = np.random.default_rng(8)
    k, n = 50, 20
    M = sp.random_array((k, n), density=0.3, rng=rng, format="csr") + sp.eye_array(k, n)
    y = rng.normal(size=k) * 2
    boxed = LeastSquaresForm(M=M, y=y, lower=-0.5, upper=0.7)
    ref = get_backend("highs").solve(boxed)          # the lifted QP, an independent solver
    for method in ("lsq_linear", "lbfgsb"):
        out = get_backend("scipy").solve(boxed, method=method)
        assert out.success
        assert out.objective == pytest.approx(ref.objective, rel=1e-8)
        np.testing.assert_allclose(out.x, ref.x, atol=1e-6)
    free = LeastSquaresForm(M=M, y=y)
    x_ls = np.linalg.lstsq(M.toarray(), y, rcond=None)[0]
    for method in ("lsmr", "lsq_linear", "lbfgsb", "auto"):
        out = get_backend("scipy").solve(free, method=method)
        assert out.success, (method, out)
        np.testing.assert_allclose(out.x, x_ls, atol=1e-6, err_msg=method)
    assert get_backend("scipy").solve(free).extra["method"] == "lsmr"
    assert get_backend("scipy").solve(boxed).extra["method"] == "lsq_linear"


def test_least_squares_limits_and_method_errors():
    rng = np.random.default_rng(9)
    M = sp.random_array((3000, 800), density=0.01, rng=rng, format="csr")
    form = LeastSquaresForm(M=M, y=rng.normal(size=3000), lower=0.0)
    out = get_backend("scipy").solve(form, method="lbfgsb", max_iter=2)
    assert out.status is Status.ITERATION_LIMIT and out.incumbent and out.x is not None
    out = get_backend("scipy").solve(form, time_limit=1e-6)      # auto → lbfgsb, stops after one step
    assert out.status is Status.TIME_LIMIT and out.incumbent and not out.success
    assert out.extra["method"] == "lbfgsb"
    with pytest.raises(SolverError, match="unbounded forms only"):
        get_backend("scipy").solve(form, method="lsmr")
    with pytest.raises(SolverError, match="time_limit"):
        get_backend("scipy").solve(form, method="lsq_linear", time_limit=1.0)
    with pytest.raises(SolverError, match="method must be one of"):
        get_backend("scipy").solve(form, method="cg")
    with pytest.raises(SolverError, match="x0"):
        get_backend("scipy").solve(form, method="lbfgsb", x0=np.zeros(3))
    with pytest.raises(SolverError, match="mip_gap"):
        get_backend("scipy").solve(form, mip_gap=0.1)


def test_least_squares_to_program_is_equivalent():
    M, y, w, x_ref, f_ref = _nnls_case(4, k=12, n=5)
    form = LeastSquaresForm(M=M, y=y, weights=w, lower=np.zeros(5))
    program = form.to_program()
    assert program.kind == "QP" and program.num_vars == 5 + 12
    r = w * (M @ x_ref - y)
    assert program.objective(np.r_[x_ref, r]) == pytest.approx(form.objective(x_ref), rel=1e-12)
    assert program.max_violation(np.r_[x_ref, r]) < 1e-12
