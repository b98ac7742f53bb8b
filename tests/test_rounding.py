"""Integer rounding: every method against brute force on tiny tables, its guarantees as properties,
the failsafe on infeasible invariants, the randomised method's unbiasedness, and input validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.errors import QueryError
from dpopt.estimate import Status, round_to_integers
from dpopt.estimate.rounding.controlled import CONTROLLED_MIP_GAP
from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.domain import Domain
from dpopt.model.queries import Identity, Marginal, Total
from dpopt.model.queries.combine import Weighted


# ---- cell-wise: the per-cell L1 optimum ---------------------------------------------------------
def brute_force_rounding(target, cs):
    """Enumerate integer tables within +-1 of floor/ceil: the L1-closest feasible one."""
    choices = [range(max(0, int(np.floor(t)) - 1), int(np.ceil(t)) + 2) for t in target]
    best = None
    for cand in itertools.product(*choices):
        x = np.array(cand, dtype=float)
        if all(r["max_violation"] < 1e-9 for r in cs.residuals(x)):
            cost = np.abs(x - target).sum()
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0, 6, allow_nan=False), min_size=6, max_size=6), st.integers(0, 5))
def test_rounding_is_exact_and_l1_optimal(values, zero_cell):
    dom = Domain(("g", "v"), (2, 3))
    target = np.array(values)
    cs = ConstraintSet(dom, [NonNegativity(), Integrality()])
    cs.add(StructuralZeros({"g": 0, "v": 2}, name="z"))
    target[2] = 0.0
    totals = np.round(Marginal(dom, ["g"]).matvec(target))
    cs.add(Invariant(Marginal(dom, ["g"]), totals, name="g_totals"))
    cs.add(Invariant(Total(dom), [totals.sum()], name="total"))
    res = round_to_integers(target, cs)
    assert res.success, res.message
    assert np.array_equal(res.x, np.round(res.x))
    assert np.array_equal(Marginal(dom, ["g"]).matvec(res.x), totals)
    assert res.x[2] == 0 and res.x.min() >= 0
    assert res.fun == pytest.approx(brute_force_rounding(target, cs), abs=1e-9)


def test_a_large_total_takes_largest_remainder_and_matches_the_lp(rng):
    """A total alone is kept by largest remainder, the same optimum as the LP vertex (here
    reached by adding a redundant inequality, which sends the problem to the LP)."""
    dom = Domain(tuple(f"b{i}" for i in range(12)), (2,) * 12)
    x = rng.gamma(0.5, 3.0, dom.size)
    cs = ConstraintSet(dom, [NonNegativity(), Integrality()])
    cs.add(Invariant(Total(dom), [np.round(x.sum())], name="total"))
    res = round_to_integers(x, cs)
    assert res.success and res.info["method"] == "cell-wise: largest remainder (invariant rows kept)"
    assert res.x.sum() == np.round(x.sum()) and np.all(res.x == np.round(res.x))
    assert np.abs(res.x - x).max() < 1.0 + 1e-9
    cs_lp = ConstraintSet(dom, list(cs.constraints) + [LinearInequality(Total(dom), lower=0.0, name="redundant")])
    lp = round_to_integers(x, cs_lp)
    assert lp.success and lp.info["method"] == "cell-wise: LP vertex (integral)" and lp.info["totally_unimodular_rows"]
    assert lp.fun == pytest.approx(res.fun, abs=1e-6)


def test_largest_remainder_keeps_a_public_total(rng):
    """The one-line replacement of the release's MWEM rounding (``_round_keeping_total``): the
    public total as an invariant, rounded cell-wise."""
    dom = Domain(("v",), (5,))
    keep = ConstraintSet(dom, [Invariant(Total(dom), [7.0], name="total")])
    for _ in range(20):
        x = rng.dirichlet(np.ones(5)) * 7.0
        res = round_to_integers(x, keep, method="cellwise")
        assert res.success and res.info["method"] == "cell-wise: largest remainder (invariant rows kept)"
        assert res.x.sum() == 7 and np.array_equal(res.x, np.round(res.x)) and (res.x >= 0).all()
        # brute force: every non-negative integer vector of 5 cells summing to 7
        best = min(np.abs(np.array(v) - x).sum() for v in itertools.product(range(8), repeat=5) if sum(v) == 7)
        assert res.fun == pytest.approx(best, abs=1e-12)
    bad = ConstraintSet(dom, [Invariant(Total(dom), [1.5], name="total")])
    assert round_to_integers(np.full(5, 0.3), bad).status is Status.INFEASIBLE


def test_without_rows_every_cell_goes_to_its_nearest_integer():
    dom = Domain(("a", "b"), (2, 3))
    cs = ConstraintSet(dom, [NonNegativity(), StructuralZeros({"a": 1, "b": 0}, name="z")])
    x = np.array([0.49, 0.51, -0.3, 2.7, 1.2, 3.5])
    res = round_to_integers(x, cs)
    assert res.success and res.info["method"] == "cell-wise: nearest integer (no rows)"
    assert res.x.tolist() == [0, 1, 0, 0, 1, 3]  # a negative value goes to 0; the pinned cell to 0
    assert res.fun == pytest.approx(np.abs(res.x - x).sum())


# ---- controlled rounding against brute force ----------------------------------------------------
CUBE = Domain(("a", "b", "c"), (2, 2, 3))
CROSSING = [Marginal(CUBE, ["a", "b"]), Marginal(CUBE, ["b", "c"]), Marginal(CUBE, ["a", "c"])]


def _fit_integer_rows(x, query):
    """Scale ``x`` within each row of ``query`` (disjoint rows) so that every row sum is an integer >= 1."""
    sums = query.matvec(x)
    goal = np.maximum(np.round(sums), 1.0)
    return x * query.rmatvec(goal / np.where(sums > 0, sums, 1.0))


def brute_force_controlled(x, cs, measured, cell_weight):
    """Every floor/ceil table meeting the constraints and keeping every measured answer within
    floor/ceil: the least ``sum ||Q x - Q x~||_1 + cell_weight ||x - x~||_1`` (None if there is none)."""
    pinned = cs.zero_mask() if cs.zero_rules else np.zeros(x.size, bool)
    free = np.flatnonzero(~pinned)
    base = np.floor(x[free])
    B = np.array(list(itertools.product((0.0, 1.0), repeat=free.size)))
    tables = np.zeros((B.shape[0], x.size))
    tables[:, free] = base + B
    ok = np.ones(B.shape[0], bool)
    for inv in cs.invariants:
        ok &= np.all(np.abs(tables @ inv.query.to_dense().T - inv.values) < 1e-9, axis=1)
    cost = cell_weight * np.abs(tables - x).sum(axis=1)
    for q in measured:
        M = q.to_dense()
        t = M @ x
        ans = tables @ M.T
        ok &= np.all((ans >= np.floor(t - 1e-9)) & (ans <= np.ceil(t + 1e-9)), axis=1)
        cost += np.abs(ans - t).sum(axis=1)
    return cost[ok].min() if ok.any() else None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 3, allow_nan=False), min_size=12, max_size=12),
       st.sampled_from(["none", "total", "a"]), st.integers(0, 11))
def test_controlled_rounding_is_the_brute_force_optimum(values, invariant, zero_cell):
    x = np.array(values)
    x[zero_cell] = 0.0
    cs = ConstraintSet(CUBE, [NonNegativity()])
    cs.add(StructuralZeros({a: int(v) for a, v in zip(CUBE.attrs, CUBE.unravel(np.array([zero_cell]))[0])}, name="z"))
    if invariant != "none":
        q = Total(CUBE) if invariant == "total" else Marginal(CUBE, ["a"])
        x = _fit_integer_rows(x, q)
        cs.add(Invariant(q, np.round(q.matvec(x)), name=invariant))
    res = round_to_integers(x, cs, measured=CROSSING, mip_gap=1e-9)
    assert res.success, res.message
    best = brute_force_controlled(x, cs, CROSSING, cell_weight=1e-3)
    if best is None:  # no floor/ceil rounding keeps every answer: the exceptions say which
        assert len(res.info["exceptions"]) > 0 or "fallback" in res.info
    else:
        assert "fallback" not in res.info and len(res.info["exceptions"]) == 0
        # HiGHS closes the gap to a relative 1e-9 of the objective
        assert res.fun == pytest.approx(best, rel=1e-8, abs=1e-9)
    for inv in cs.invariants:
        assert np.array_equal(inv.query.matvec(res.x), inv.values)
    assert res.x[zero_cell] == 0 and np.array_equal(res.x, np.round(res.x))


def test_controlled_rounding_reports_a_certified_gap(rng):
    """With the default gap the point is within 2 % of the LP bound, which is below the optimum."""
    x = _fit_integer_rows(rng.gamma(0.6, 1.5, CUBE.size), Total(CUBE))
    cs = ConstraintSet(CUBE, [NonNegativity(), Invariant(Total(CUBE), [np.round(x.sum())], name="total")])
    res = round_to_integers(x, cs, measured=CROSSING)
    best = brute_force_controlled(x, cs, CROSSING, cell_weight=1e-3)
    assert res.success and res.info["gap"] <= CONTROLLED_MIP_GAP
    assert res.info["lower_bound"] <= best + 1e-9 and best <= res.fun + 1e-9
    assert res.fun - res.info["lower_bound"] <= CONTROLLED_MIP_GAP * max(res.fun, 1.0) + 1e-9


def test_one_measured_marginal_nested_in_the_invariant_is_an_integral_lp(rng):
    """A marginal nested in the invariant's rows: two laminar families, an integral LP vertex."""
    dom = Domain(("s", "c", "v"), (2, 3, 4))
    x = _fit_integer_rows(rng.gamma(0.7, 2.0, dom.size), Marginal(dom, ["s"]))
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Marginal(dom, ["s"]), np.round(Marginal(dom, ["s"]).matvec(x)),
                                                         name="s totals")])
    res = round_to_integers(x, cs, measured=[Marginal(dom, ["s", "c"]), Marginal(dom, ["v"])])
    first = res.info["passes"][0]
    assert res.success and first["totally_unimodular_rows"] and first["step"] == "LP vertex (integral)"
    assert res.info["gap"] == pytest.approx(0.0, abs=1e-9)


def test_interior_point_lp_certifies_like_the_default_one():
    """Where the LP only certifies (no neighbourhood is built around its vertex), solving it by
    interior point gives the same bound and the same MIP optimum as the default method (issue #30)."""
    from dpopt.estimate.backends.registry import get_backend
    from dpopt.estimate.rounding.controlled import MeasuredQuery, _measured_rows, _Pass
    from dpopt.estimate.rounding.model import RoundingTable
    from dpopt.estimate.rounding.solve import Deadline, lp_only_certifies, solve_integer_program

    dom = Domain(("a", "b", "c", "d"), (3, 4, 5, 2))
    queries = [Marginal(dom, list(p)) for p in ("ab", "bc", "ac", "cd", "ad")]
    engine = get_backend("highs")
    methods = []
    solve = engine.solve

    def spy(f, **kw):
        methods.append(kw.get("method"))
        return solve(f, **kw)

    engine.solve = spy
    mips = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)  # test input only
        x = _fit_integer_rows(rng.gamma(0.8, 2.0, dom.size), Total(dom))
        cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), [np.round(x.sum())], name="total")])
        table = RoundingTable(x, cs)
        prog = _Pass(table, [_measured_rows(table, MeasuredQuery(str(i), q)) for i, q in enumerate(queries)], [],
                     1e-3)
        form = prog.form(prog.movable, np.zeros(table.k), soft=False)
        assert lp_only_certifies(form)
        methods.clear()
        default = solve_integer_program(form, engine, deadline=Deadline(60), mip_gap=1e-9, options={})
        assert set(methods) == {None}
        methods.clear()
        ipm = solve_integer_program(form, engine, deadline=Deadline(60), mip_gap=1e-9, options={}, lp_method="ipm")
        assert methods[0] == "ipm" and set(methods[1:]) <= {None}  # the LP only; the MIP keeps its method
        assert default.success and ipm.success
        assert ipm.bound == pytest.approx(default.bound, rel=1e-9, abs=1e-9)
        assert ipm.objective == pytest.approx(default.objective, rel=1e-8, abs=1e-9)
        mips += len(default.stages) > 1
    assert mips >= 2  # the LP vertex was fractional and the full MIP decided (3 of the 6 seeds)
    # an option the caller gave wins over lp_method
    methods.clear()
    solve_integer_program(form, engine, deadline=Deadline(60), mip_gap=1e-9, options={"method": "simplex"},
                          lp_method="ipm")
    assert methods[0] == "simplex"

# ---- properties: exact constraints, answers within floor/ceil or reported -----------------------
GEO = Domain.from_dict({"state": ["A", "B"], "county": ["A1", "A2", "B1", "B2"], "age": 3, "sex": 2})
GEO_PARENT = {"A1": "A", "A2": "A", "B1": "B", "B2": "B"}


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.05, 3.0))
def test_controlled_rounding_keeps_every_rule_exactly(seed, mean):
    rng = np.random.default_rng(seed)  # test input only
    cs = ConstraintSet(GEO, [NonNegativity(), Hierarchy("state", "county", GEO_PARENT),
                             StructuralZeros("age == 0 and sex == 1", name="rule")])
    x = rng.gamma(0.5, 2 * mean, GEO.size)
    x[cs.zero_mask()] = 0.0
    states = Marginal(GEO, ["state"])
    x = _fit_integer_rows(x, states)
    cs.add(Invariant(states, np.round(states.matvec(x)), name="state totals"))
    measured = [Marginal(GEO, ["county", "age"]), Marginal(GEO, ["state", "sex"]), Marginal(GEO, ["age", "sex"])]
    res = round_to_integers(x, cs, measured=measured)
    assert res.success, res.message
    assert np.array_equal(res.x, np.round(res.x)) and res.max_violation == 0.0
    assert np.all(res.x[cs.zero_mask()] == 0)
    assert np.array_equal(states.matvec(res.x), np.round(states.matvec(x)))
    if "fallback" not in res.info:
        assert np.all((res.x == np.floor(x)) | (res.x == np.ceil(x)))
    reported = res.info["exceptions"]
    change = res.info["measured_change"]
    for q, row in zip(measured, change.itertuples()):
        t, a = q.matvec(x), q.matvec(res.x)
        outside = np.flatnonzero((a < np.floor(t - 1e-9)) | (a > np.ceil(t + 1e-9)))
        assert sorted(reported[reported["query"] == q.name]["row"]) == outside.tolist()
        assert row.l1_change == pytest.approx(np.abs(a - t).sum()) and row.outside_floor_ceil == outside.size
        assert row.max_change == pytest.approx(np.abs(a - t).max())


def test_passes_keep_the_answers_of_earlier_passes(rng):
    cs = ConstraintSet(GEO, [NonNegativity(), Hierarchy("state", "county", GEO_PARENT)])
    x = rng.gamma(0.6, 2.0, GEO.size)
    x[cs.zero_mask()] = 0.0
    measured = [Marginal(GEO, ["county", "age"]), Marginal(GEO, ["age"])]
    one = round_to_integers(x, cs, measured=measured, mip_gap=1e-9)
    two = round_to_integers(x, cs, measured=measured, passes=[[1], [0]], mip_gap=1e-9)
    assert one.success and two.success and two.info["method"] == "controlled (2 passes)"
    coarse = Marginal(GEO, ["age"])
    first = round_to_integers(x, cs, measured=[coarse], mip_gap=1e-9)
    # pass 1 alone is the first pass of the two; its answers are kept by pass 2
    assert np.array_equal(coarse.matvec(two.x), coarse.matvec(first.x))
    assert two.fun >= one.fun - 1e-9  # holding pass 1 fixed can only cost
    with pytest.raises(QueryError, match="passes must split"):
        round_to_integers(x, cs, measured=measured, passes=[[0]])


def test_answers_the_invariants_push_out_of_floor_ceil_are_reported():
    """Invariants the fractional table does not meet (a-totals 3 and 3 where x~ has 2.2 and 2.2):
    the measured total (4.4) cannot stay within [4, 5]; the soft rows let it go to 6 and report it."""
    dom = Domain(("a", "b", "c"), (2, 2, 2))
    x = np.full(8, 0.55)
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Marginal(dom, ["a"]), [3.0, 3.0], name="a totals")])
    measured = [Total(dom), Marginal(dom, ["b", "c"])]
    res = round_to_integers(x, cs, measured=measured)
    assert res.success and res.info["soft"] and "fallback" not in res.info
    assert np.array_equal(Marginal(dom, ["a"]).matvec(res.x), [3, 3])
    assert np.all((res.x == 0) | (res.x == 1))
    exceptions = res.info["exceptions"]
    assert exceptions[exceptions["query"] == "Total"][["fractional", "released", "outside_by"]].values.tolist() == [
        [4.4, 6.0, 1.0]]
    assert res.info["measured_change"]["outside_floor_ceil"].sum() == len(exceptions)
    # b x c answers are 1.1 each: floor/ceil allows 2 at most, and 6 persons over 4 answers need
    # two of them at 2: no answer of b x c has to leave its interval
    assert (exceptions["query"] != Marginal(dom, ["b", "c"]).name).all()


# ---- failsafe ---------------------------------------------------------------------------------
def test_failsafe_relaxes_a_contradictory_invariant_with_the_least_slack():
    dom = Domain(("a", "b"), (2, 3))
    x = np.array([1.2, 0.8, 1.0, 2.0, 1.5, 0.5])
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Marginal(dom, ["a"]), [3.0, 4.0], name="a totals"),
                             Invariant(Total(dom), [8.0], name="total")])
    plain = round_to_integers(x, cs)
    assert plain.status is Status.INFEASIBLE and not plain.success and plain.x is None
    with pytest.warns(UserWarning, match="relaxed 1 invariant row"):
        res = round_to_integers(x, cs, failsafe=True, relax=["total"])
    assert res.success and res.x.sum() == 7
    assert np.array_equal(Marginal(dom, ["a"]).matvec(res.x), [3, 4])
    relaxed = res.info["relaxed"]
    assert relaxed.to_dict("records") == [{"constraint": "invariant:total", "row": 0, "declared": 8.0,
                                           "released": 7.0, "slack": -1.0, "weight": 1.0}]
    # the residual table is against the declared invariants: the relaxation shows
    assert not res.constraint_residuals.set_index("constraint").loc["invariant:total", "satisfied"]


def test_failsafe_relaxes_parent_equals_sum_of_children_when_children_cannot_hold_it():
    """Top-down's case: a parent count the children's structural zeros cannot carry."""
    dom = Domain(("child", "v"), (3, 2))
    cs = ConstraintSet(dom, [NonNegativity(), StructuralZeros({"child": 2}, name="closed")])
    parent = Marginal(dom, ["v"])
    cs.add(Invariant(parent, [2.0, 9.0], name="parent = sum of children"))
    cs.add(Invariant(Marginal(dom, ["child"]), [1.0, 3.0, 0.0], name="child totals"))
    x = np.array([0.5, 0.5, 1.0, 2.0, 0.0, 0.0])
    with pytest.warns(UserWarning):
        res = round_to_integers(x, cs, failsafe=True, relax=["parent = sum of children"], measured=[parent])
    assert res.success and np.array_equal(Marginal(dom, ["child"]).matvec(res.x), [1, 3, 0])
    slack = res.info["relaxed"]["slack"].abs().sum()
    assert slack == 7.0  # 11 declared, 4 possible: the least L1 slack
    assert res.x[[4, 5]].sum() == 0


def test_failsafe_relaxes_a_non_integer_value():
    dom = Domain(("a",), (4,))
    cs = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), [5.5], name="total")])
    x = np.full(4, 5.5 / 4)
    plain = round_to_integers(x, cs)
    assert plain.status is Status.INFEASIBLE and "non-integer" in plain.message
    with pytest.warns(UserWarning):
        res = round_to_integers(x, cs, failsafe=True)
    assert res.success and res.x.sum() in (5, 6) and abs(res.info["relaxed"]["slack"].iloc[0]) == 0.5


# ---- randomised rounding ----------------------------------------------------------------------
def test_randomized_rounding_is_unbiased_and_keeps_nested_totals(rng):
    cs = ConstraintSet(GEO, [NonNegativity(), Hierarchy("state", "county", GEO_PARENT)])
    x = rng.gamma(0.6, 1.5, GEO.size)
    x[cs.zero_mask()] = 0.0
    counties, states = Marginal(GEO, ["county"]), Marginal(GEO, ["state"])
    x = _fit_integer_rows(x, counties)
    cs.add(Invariant(states, np.round(states.matvec(x)), name="state totals"))
    cs.add(Invariant(counties, np.round(counties.matvec(x)), name="county totals"))
    draws = 600
    total = np.zeros(GEO.size)
    for _ in range(draws):
        res = round_to_integers(x, cs, method="randomized", uniforms=rng.random(GEO.size + 1))
        assert np.all((res.x == np.floor(x)) | (res.x == np.ceil(x)))
        assert np.array_equal(counties.matvec(res.x), np.round(counties.matvec(x)))
        total += res.x
    f = x - np.floor(x)
    sd = np.sqrt(f * (1 - f) / draws)
    assert np.all(np.abs(total / draws - x) <= 4.5 * sd + 1e-9)  # E[x] = x~, cell by cell


def test_randomized_rounding_refuses_what_it_cannot_keep():
    dom = Domain(("a", "b"), (2, 2))
    x = np.full(4, 0.5)
    crossing = ConstraintSet(dom, [Invariant(Marginal(dom, ["a"]), [1.0, 1.0], name="a"),
                                   Invariant(Marginal(dom, ["b"]), [1.0, 1.0], name="b")])
    with pytest.raises(QueryError, match="nested"):
        round_to_integers(x, crossing, method="randomized", uniforms=np.full(5, 0.5))
    ineq = ConstraintSet(dom, [LinearInequality(Total(dom), upper=3.0, name="cap")])
    with pytest.raises(QueryError, match="inequalities"):
        round_to_integers(x, ineq, method="randomized", uniforms=np.full(5, 0.5))
    with pytest.raises(QueryError, match="needs uniforms"):
        round_to_integers(x, ConstraintSet(dom), method="randomized")


# ---- reports and validation -------------------------------------------------------------------
def test_every_method_reports_how_far_the_measured_answers_moved(rng):
    cs = ConstraintSet(GEO, [NonNegativity(), Hierarchy("state", "county", GEO_PARENT)])
    x = rng.gamma(0.5, 1.0, GEO.size)
    x[cs.zero_mask()] = 0.0
    q = Marginal(GEO, ["age", "sex"])
    res = round_to_integers(x, cs, measured=[q], method="cellwise")
    row = res.info["measured_change"].iloc[0]
    moved = np.abs(q.matvec(res.x) - q.matvec(x))
    assert row["query"] == q.name and row["rows"] == 6
    assert row["l1_change"] == pytest.approx(moved.sum()) and row["max_change"] == pytest.approx(moved.max())


def test_bad_rounding_input_raises_one_clear_error():
    dom = Domain(("a", "b"), (2, 2))
    cs = ConstraintSet(dom, [NonNegativity()])
    x = np.full(4, 0.5)
    with pytest.raises(QueryError, match="unknown rounding method"):
        round_to_integers(x, cs, method="stochastic")
    with pytest.raises(QueryError, match="needs the measured queries"):
        round_to_integers(x, cs, method="controlled")
    with pytest.raises(QueryError, match="weights has 2 values for 1"):
        round_to_integers(x, cs, measured=[Total(dom)], weights=[1, 2])
    with pytest.raises(QueryError, match="uniforms are used by method 'randomized' only"):
        round_to_integers(x, cs, uniforms=np.zeros(5))
    with pytest.raises(QueryError, match="non-integer coefficients"):
        round_to_integers(x, cs, measured=[Weighted(Identity(dom), 0.5)])
    with pytest.raises(QueryError, match="mip_gap"):
        round_to_integers(x, cs, measured=[Total(dom)], mip_gap=2.0)
    with pytest.raises(QueryError, match="4 finite values"):
        round_to_integers(np.full(3, 0.5), cs)
    with pytest.raises(QueryError, match=r"measured\[0\] must be a LinearQuery"):
        round_to_integers(x, cs, measured=["a"])
    other = Domain(("z",), (4,))
    with pytest.raises(QueryError, match="is over"):
        round_to_integers(x, cs, measured=[Total(other)])
    with pytest.raises(QueryError, match="no invariant named"):
        round_to_integers(x, ConstraintSet(dom, [Invariant(Total(dom), [0.5], name="t")]), failsafe=True,
                          relax=["nope"])
