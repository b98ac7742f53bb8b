"""Top-down release: agreement with a joint solve, exact constraints at every level, the failsafe,
executors bit for bit, the noise, the spec and the release files."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from dpopt.algorithms.topdown import GeographySpec, LevelMeasure, TopDown, TopDownParams, UnitInvariant
from dpopt.algorithms.topdown.constraints import invariant_from_data, invariants_by_unit, sum_up, zero_rules
from dpopt.algorithms.topdown.engine import run_levels
from dpopt.algorithms.topdown.executors import SerialExecutor
from dpopt.algorithms.topdown.solve import SolveOptions
from dpopt.errors import InconsistentConstraintsError, ParameterError, SpecError
from dpopt.estimate import reconstruct
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.geography import Geography
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.explicit import SparseQuery
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import SeededRandom
from dpopt.release.outputs import read_released

RHO = Budget.zcdp(Fraction(1, 2))


def records(domain: Domain, n: int, seed: int, forbid=None) -> Dataset:
    """``n`` random records (test input, not privacy noise), none in cells ``forbid`` rejects."""
    gen = np.random.default_rng(seed)
    codes = np.column_stack([gen.integers(0, s, n) for s in domain.sizes])
    if forbid is not None:
        codes = codes[~forbid(codes)]
    return Dataset(codes, domain)


def params(geo_spec, chars, levels, *, extra=None, **options):
    """Identity at every level (and ``extra[level]`` queries), equal shares."""
    extra = extra or {}
    pairs = [(lv, "detailed", Identity(chars)) for lv in levels]
    pairs += [(lv, label, q) for lv, items in extra.items() for label, q in items]
    share = Fraction(1, len(pairs))
    measures = tuple(LevelMeasure(label, lv, q, None, share) for lv, label, q in pairs)
    return TopDownParams(geo_spec, measures, **{"executor": "serial", **options})


def fractional_run(domain, geography, data, measures_params, constraints, invariants=()):
    """Run level by level keeping each parent's fractional L2 solution (engine internals)."""
    algorithm = TopDown(measures_params)
    plan = algorithm.plan(domain, constraints, RHO)
    chars = plan.details.characteristics
    invs = sum_up(invariants_by_unit(constraints, geography, chars) + list(invariants), geography)
    return run_levels(geography, chars, geography.leaf_histograms(data), list(plan.details.queries), invs,
                      zero_rules(constraints, geography, chars), RHO.accountant(), SeededRandom(4),
                      executor=SerialExecutor(), options=SolveOptions(keep_fractional=True))


def leaf_fractional(outcome, geography, chars):
    """The leaves' fractional tables, from every parent's solution of the last level."""
    order, starts = geography.children(geography.depth - 2)
    out = np.zeros((geography.sizes[-1], chars.size))
    for sol in outcome.levels[-1].solutions:
        children = order[starts[sol.parent]:starts[sol.parent + 1]]
        out[children] = sol.fractional
    return out


# ---- agreement with one joint solve ---------------------------------------------------------------------
@pytest.mark.parametrize("depth", [2, 3])
def test_levels_solve_like_one_joint_problem_when_the_parents_are_pinned(depth):
    """With the parents' tables published exactly, the children's problems separate: the per-parent
    L2 solutions are the joint L2 solution over the whole domain (the same measurements and
    constraints, one engine call)."""
    attrs = {"g1": 3, "g2": 2, "c": 4} if depth == 3 else {"g1": 5, "c": 4}
    domain = Domain.from_dict(attrs)
    geo_attrs = [a for a in attrs if a != "c"]
    geography = Geography.from_columns(domain, geo_attrs, parents="nested")
    data = records(domain, 400, seed=depth)
    chars = geography.characteristics(domain)
    pinned = geo_attrs[-2] if depth == 3 else "nation"
    pin = invariant_from_data("pinned", geography, pinned, Identity(chars), geography.leaf_histograms(data))
    leaf_level = geo_attrs[-1]
    p = params(GeographySpec(geography=geography), chars, geography.names,
               extra={leaf_level: [("total", Total(chars))]})
    constraints = ConstraintSet(domain, [NonNegativity()])
    outcome = fractional_run(domain, geography, data, p, constraints, [pin])
    assert outcome.status is Status.OPTIMAL
    x_topdown = leaf_fractional(outcome, geography, chars)

    # The same leaf measurements over the full domain (leaf i, cell c is domain cell i * 4 + c here).
    noisy = outcome.levels[-1].noisy
    leaf_query = [q for q in TopDown(p).plan(domain, constraints, RHO).details.queries if q.level == geography.depth - 1]
    law = {q.label: q.law for q in leaf_query}
    ms = [Measurement(Identity(domain), noisy["detailed"].ravel(), law["detailed"].family, law["detailed"].scale,
                      law["detailed"].variance, label="detailed"),
          Measurement(Marginal(domain, geo_attrs), noisy["total"].ravel(), law["total"].family, law["total"].scale,
                      law["total"].variance, label="total")]
    pinned_attrs = geo_attrs[:-1] + ["c"] if depth == 3 else ["c"]
    truth = Marginal(domain, pinned_attrs).answer(data)
    joint = reconstruct(ms, ConstraintSet(domain, [NonNegativity(), Invariant(Marginal(domain, pinned_attrs), truth)]),
                        "l2", integer=False)
    assert joint.success
    # Clarabel (cvxpy's default here) certifies a relative duality gap of 1e-8; the objective
    # weighs every cell by 1/sigma^2 (strongly convex), so each cell is within about
    # sqrt(gap * sigma^2) < 1e-3 of the unique minimiser in both solves.
    assert np.abs(x_topdown.ravel() - joint.x).max() < 1e-3
    per_parent = sum(s.l2_objective for s in outcome.levels[-1].solutions)
    assert per_parent == pytest.approx(joint.fun, rel=1e-5, abs=1e-5)



def test_every_named_l2_backend_fits_the_same_tables():
    """``backend = "clarabel"`` (called directly) fits what cvxpy and HiGHS fit, within what the
    solvers certify: each certifies a relative gap of about 1e-8 on a strongly convex objective
    (every cell weighed by 1/sigma^2), so every cell is within sqrt(gap * sigma^2) < 1e-3 of the
    unique minimiser (as in the test above)."""
    from dpopt.algorithms.topdown.algorithm import _L2_BACKENDS
    from dpopt.estimate.backends.registry import get_backend

    domain = Domain.from_dict({"g1": 3, "g2": 2, "c": 4})
    geography = Geography.from_columns(domain, ["g1", "g2"], parents="nested")
    data = records(domain, 400, seed=7)
    chars = geography.characteristics(domain)
    constraints = ConstraintSet(domain, [NonNegativity()])
    fits = {}
    for backend in ("clarabel", "cvxpy", "highs"):
        assert backend in _L2_BACKENDS
        if not get_backend(backend).is_installed():
            continue
        p = params(GeographySpec(geography=geography), chars, geography.names, backend=backend,
                   extra={"g2": [("total", Total(chars))]})
        algorithm = TopDown(p)
        plan = algorithm.plan(domain, constraints, RHO)
        invs = sum_up(invariants_by_unit(constraints, geography, plan.details.characteristics), geography)
        outcome = run_levels(geography, plan.details.characteristics, geography.leaf_histograms(data),
                             list(plan.details.queries), invs, zero_rules(constraints, geography, chars),
                             RHO.accountant(), SeededRandom(4), executor=SerialExecutor(),
                             options=SolveOptions(backend=backend, keep_fractional=True))
        assert outcome.status is Status.OPTIMAL
        fits[backend] = (leaf_fractional(outcome, geography, chars),
                         sum(s.l2_objective for s in outcome.levels[-1].solutions))
    assert "clarabel" in fits and len(fits) >= 2
    x0, f0 = fits["clarabel"]
    for backend, (x, f) in fits.items():
        assert np.abs(x - x0).max() < 1e-3, backend
        assert f == pytest.approx(f0, rel=1e-5, abs=1e-5), backend


# ---- exact constraints at every level (property test) --------------------------------------------------
@st.composite
def cases(draw):
    depth = draw(st.integers(1, 2))
    geo = {f"g{k}": draw(st.integers(1, 3)) for k in range(depth)}
    chars = {"c0": draw(st.integers(2, 3)), "c1": 2}
    n = draw(st.integers(0, 150))
    forbid_value = draw(st.integers(0, chars["c0"] - 1))
    invariant_level = draw(st.sampled_from(["none", "nation", *geo]))
    seed = draw(st.integers(0, 10**6))
    return geo, chars, n, forbid_value, invariant_level, seed


@settings(max_examples=8, deadline=None)
@given(cases())
def test_every_level_is_integral_nonnegative_consistent_and_keeps_its_constraints(case):
    geo, chars_sizes, n, forbid_value, invariant_level, seed = case
    domain = Domain.from_dict({**geo, **chars_sizes})
    c0 = domain.axis("c0")
    c1 = domain.axis("c1")
    data = records(domain, n, seed, forbid=lambda codes: (codes[:, c0] == forbid_value) & (codes[:, c1] == 1))
    geography = Geography.from_columns(domain, list(geo), parents="nested")
    chars = geography.characteristics(domain)
    constraints = ConstraintSet(domain, [NonNegativity(),
                                         StructuralZeros({"c0": forbid_value, "c1": 1}, name="edit rule")])
    invariants = ()
    if invariant_level != "none":
        invariants = (invariant_from_data("totals", geography, invariant_level, Total(chars),
                                          geography.leaf_histograms(data)),)
    p = params(GeographySpec(geography=geography), chars, geography.names, invariants=invariants)
    algorithm = TopDown(p)
    release = algorithm.run(algorithm.plan(domain, constraints, RHO), data, RHO.accountant(), SeededRandom(seed))
    assert release.success, release.message
    zero = zero_rules(constraints, geography, chars).shared
    truth = geography.level_histograms(geography.leaf_histograms(data))
    for k, name in enumerate(geography.names):
        table = release.level_tables[name]
        assert table.dtype == np.int64 and (table >= 0).all() and not table[:, zero].any()
        if k:
            sums = np.zeros_like(release.level_tables[geography.names[k - 1]])
            np.add.at(sums, geography.parents[k], table)
            assert np.array_equal(sums, release.level_tables[geography.names[k - 1]])
        if invariant_level != "none" and k <= geography.level(invariant_level):
            # the invariant and its sums on every coarser level hold exactly
            assert np.array_equal(table.sum(axis=1), np.asarray(truth[k].sum(axis=1)).ravel())
    assert release.counts.sum() == release.level_tables["nation"].sum()


# ---- the failsafe ---------------------------------------------------------------------------------------
def failsafe_case():
    domain = Domain.from_dict({"state": ["A", "B"], "county": ["A-1", "A-2", "B-1"], "c": 2})
    geography = Geography.from_columns(domain, ["state", "county"])
    forbid = lambda codes: (codes[:, 1] == 2) != (codes[:, 0] == 1)  # noqa: E731 - counties nest in states
    data = records(domain, 60, seed=3, forbid=forbid)
    # A public invariant on county A-1 alone that its state cannot hold: A-1 has 500 persons.
    row = np.zeros(domain.size)
    row[[domain.cell_index({"state": 0, "county": 0, "c": c}) for c in range(2)]] = 1
    constraints = ConstraintSet(domain, [NonNegativity(),
                                         Invariant(SparseQuery(domain, row[None, :]), [500.0], name="A-1 total")])
    return domain, geography, data, constraints


def test_an_infeasible_parent_is_relaxed_by_the_smallest_slack_and_reported():
    domain, geography, data, constraints = failsafe_case()
    chars = geography.characteristics(domain)
    algorithm = TopDown(params(GeographySpec(("state", "county")), chars, geography.names))
    release = algorithm.run(algorithm.plan(domain, constraints, RHO), data, RHO.accountant(), SeededRandom(1))
    assert release.success
    (event,) = release.failsafe
    assert event["parent"] == "A" and event["level"] == 2 and event["constraint"] == "parent = sum of children"
    state_a = release.level_tables["state"][0]
    counties = release.level_tables["county"]
    # A-1 holds exactly 500 and the smallest slack makes room for it: A-2 is left empty.
    assert counties[0].sum() == 500 and counties[1].sum() == 0
    assert event["l1_slack"] == 500 - state_a.sum() and event["relaxed"]
    assert np.array_equal(counties[0] + counties[1] - state_a, _slack_vector(event, chars))
    assert np.array_equal(counties[2], release.level_tables["state"][1])  # B is untouched
    (_, county_report) = release.info["levels"][1:]
    assert county_report["constraint_residuals"]["parent_sum_max_violation"] == 0
    assert county_report["constraint_residuals"]["parent_sum_failsafe_slack"] == event["l1_slack"]
    assert any("failsafe under state 'A'" in note and "500 persons" not in note for note in release.notes)
    assert event["cells"] and all(isinstance(c, str) for c in event["cells"])


def _slack_vector(event, chars):
    """The event's slack per cell (the characteristics here are one unlabelled attribute: names are codes)."""
    out = np.zeros(chars.size, dtype=np.int64)
    names = {str(c): c for c in range(chars.size)}
    for cell, slack in zip(event["cells"], event["slack"]):
        out[names[cell]] = slack
    return out


def test_without_the_failsafe_an_infeasible_parent_stops_the_release_naming_it():
    domain, geography, data, constraints = failsafe_case()
    chars = geography.characteristics(domain)
    algorithm = TopDown(params(GeographySpec(("state", "county")), chars, geography.names, failsafe=False))
    release = algorithm.run(algorithm.plan(domain, constraints, RHO), data, RHO.accountant(), SeededRandom(1))
    assert not release.success and release.status is Status.INFEASIBLE
    assert "level 'county'" in release.message and "parent 'A'" in release.message
    assert release.counts is None


# ---- executors -------------------------------------------------------------------------------------------
def census_case(states=2, counties=3, rows=1500):
    from dpopt.datasets.census import census_domain, generate_census, structural_zero_rules

    domain = census_domain(states, counties)
    data = Dataset.from_frame(generate_census(rows, num_states=states, counties_per_state=counties, seed=1), domain)
    cs = ConstraintSet(domain, [NonNegativity()])
    for i, (rule, reason) in enumerate(structural_zero_rules(domain)):
        cs.add(StructuralZeros(rule, name=f"rule {i}", reason=reason))
    cs.invariant_from_data(Marginal(domain, ("state",)), data, "state totals")
    return domain, data, cs


def run_census(executor, seed=5, **options):
    domain, data, cs = census_case()
    geography = Geography.from_columns(domain, ["state", "county"])
    chars = geography.characteristics(domain)
    p = params(GeographySpec(("state", "county")), chars, geography.names,
               extra={"county": [("age x sex", Marginal(chars, ("age_group", "sex")))]}, executor=executor, **options)
    algorithm = TopDown(p)
    return algorithm.run(algorithm.plan(domain, cs, RHO), data, RHO.accountant(), SeededRandom(seed))


def test_serial_and_process_pool_release_the_same_tables_bit_for_bit():
    serial = run_census("serial")
    pool = run_census("pool", workers=2)
    assert serial.success and pool.success
    for name in serial.level_tables:
        assert np.array_equal(serial.level_tables[name], pool.level_tables[name])
    assert np.array_equal(serial.counts, pool.counts)
    assert pool.info["executor"] == "pool (2 processes)"


def _blas_threads(_task) -> list[int]:
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_pool_workers_run_blas_on_one_thread_even_when_the_parent_runs_more():
    # Under fork the worker inherits BLAS already loaded with the parent's thread count, so only a
    # limit applied inside the worker holds; setting OPENBLAS_NUM_THREADS there limited nothing.
    from threadpoolctl import threadpool_limits

    from dpopt.algorithms.topdown.executors import PoolExecutor

    with threadpool_limits(limits=2, user_api="blas"):
        # Other tests may load a single-threaded BLAS build too (the full suite did: [1, 2, 2]).
        assert max(_blas_threads(None)) == 2
        executor = PoolExecutor(workers=1)
        try:
            (worker,) = executor.map(_blas_threads, [None])
        finally:
            executor.close()
    assert worker and set(worker) == {1}


# ---- noise, ledger, accuracy -------------------------------------------------------------------------
def test_each_level_query_is_charged_once_and_its_noise_has_the_planned_law():
    domain = Domain.from_dict({"unit": 300, "c": 4})
    geography = Geography.from_columns(domain, ["unit"], parents="nested")
    chars = geography.characteristics(domain)
    data = records(domain, 3000, seed=2)
    p = params(GeographySpec(geography=geography), chars, geography.names,
               extra={"unit": [("total", Total(chars))]})
    algorithm = TopDown(p)
    plan = algorithm.plan(domain, ConstraintSet(domain), RHO)
    release = algorithm.run(plan, data, RHO.accountant(), SeededRandom(9))
    ledger = release.ledger
    assert list(ledger["label"]) == ["nation: detailed", "unit: detailed", "unit: total"]
    assert sum(ledger["rho"], Fraction(0)) == RHO.rho
    truth = geography.leaf_histograms(data).toarray()
    for label, answers in (("detailed", truth), ("total", truth.sum(axis=1, keepdims=True))):
        law = next(q.law for q in plan.details.queries if q.level == 1 and q.label == label)
        noise = (release.noisy["unit"][label] - answers).ravel()
        assert np.all(noise == np.round(noise))  # integer noise on integer answers
        # Sample mean and variance of n draws within 4.5 standard errors of the law's (0 and variance).
        n = noise.size
        assert abs(noise.mean()) < 4.5 * np.sqrt(law.variance / n)
        assert abs(noise.var() - law.variance) < 4.5 * law.variance * np.sqrt(2 / n)


def test_the_release_is_closer_to_the_truth_than_its_noisy_measurements():
    release = run_census("serial", seed=11)
    domain, data, _ = census_case()
    geography = release.geography
    truth = geography.level_histograms(geography.leaf_histograms(data))
    for k, name in enumerate(geography.names):
        released = np.abs(release.level_tables[name] - truth[k].toarray()).mean()
        noisy = np.abs(release.noisy[name]["detailed"] - truth[k].toarray()).mean()
        assert released < noisy, name


# ---- constraints per unit ----------------------------------------------------------------------------
def test_invariants_are_placed_on_the_coarsest_level_that_holds_them_and_summed_up():
    domain = Domain.from_dict({"state": ["A", "B"], "county": ["A-1", "A-2", "B-1"], "c": 3})
    geography = Geography.from_columns(domain, ["state", "county"])
    chars = geography.characteristics(domain)
    data = records(domain, 200, seed=1, forbid=lambda codes: (codes[:, 1] == 2) != (codes[:, 0] == 1))
    cs = ConstraintSet(domain)
    cs.invariant_from_data(Marginal(domain, ("county",)), data, "county totals")
    cs.invariant_from_data(Marginal(domain, ("c",)), data, "nation by c")
    found = invariants_by_unit(cs, geography, chars)
    placed = sorted((inv.name.split(" [")[0], geography.names[inv.level], tuple(geography.units[inv.level][inv.units]))
                    for inv in found)
    # B-1 is B's only county: its total is B's total, a row on the state's table.
    assert [p for p in placed if p[0] == "county totals"] == [("county totals", "county", ("A-1", "A-2")),
                                                              ("county totals", "state", ("B",))]
    assert {p[1] for p in placed if p[0] == "nation by c"} == {"nation"}
    summed = sum_up(found, geography)
    derived = [inv for inv in summed if inv.derived]
    assert {geography.names[inv.level] for inv in derived} == {"state", "nation"}
    state_rows = {geography.units[1][u]: v for inv in summed if inv.level == 1 and "county totals" in inv.name
                  for u, v in zip(inv.units, inv.values.ravel())}
    assert [state_rows["A"], state_rows["B"]] == [float(v) for v in Marginal(domain, ("state",)).answer(data)]
    (nation,) = [inv for inv in derived if inv.level == 0]
    assert nation.values.ravel().tolist() == [float(data.total)]
    # A row mixing units of different parents with different weights cannot be kept top-down.
    row = np.zeros(domain.size)
    row[domain.cell_index({"state": 0, "county": 0, "c": 0})] = 1
    row[domain.cell_index({"state": 1, "county": 2, "c": 0})] = 2
    bad = ConstraintSet(domain, [Invariant(SparseQuery(domain, row[None, :]), [3.0], name="mixed")])
    with pytest.raises(ParameterError, match="invariant 'mixed'.*single units"):
        invariants_by_unit(bad, geography, chars)


def test_a_parent_invariant_that_disagrees_with_its_childrens_sum_is_refused():
    geography = Geography.from_columns(Domain.from_dict({"g": 2, "c": 2}), ["g"], parents="nested")
    ones = sp.csr_matrix(np.ones((1, 2)))
    children = UnitInvariant("children", 1, ones, [0, 1], [[3.0], [4.0]])
    parent = UnitInvariant("parent", 0, ones, [0], [[8.0]])
    with pytest.raises(InconsistentConstraintsError, match=r"'parent' and 'children \(summed to nation\)' give unit 0"):
        sum_up([parent, children], geography)
    assert len(sum_up([UnitInvariant("parent", 0, ones, [0], [[7.0]]), children], geography)) == 2


def test_zero_rules_naming_the_geography_apply_to_their_units_only():
    domain = Domain.from_dict({"g": ["A", "B"], "c": 3})
    geography = Geography.from_columns(domain, ["g"], parents="nested")
    cs = ConstraintSet(domain, [StructuralZeros("g == 'A' and c == 2", name="A has no c=2"),
                                StructuralZeros("c == 0", name="no c=0")])
    rules = zero_rules(cs, geography, geography.characteristics(domain))
    assert list(rules.shared) == [True, False, False]
    assert rules.leaf.toarray().tolist() == [[False, False, True], [False, False, False]]
    assert rules.forbidden(geography, 0).tolist() == [[False, False, False]]


# ---- the plan and the spec -------------------------------------------------------------------------
def test_the_plan_refuses_queries_on_the_geography_and_levels_without_measurements():
    domain = Domain.from_dict({"g": 2, "c": 3})
    geography = Geography.from_columns(domain, ["g"], parents="nested")
    chars = geography.characteristics(domain)
    from dpopt.spec.queries import QuerySpec

    measures = (LevelMeasure("m", "nation", QuerySpec("marginal", attrs=("g",)), None, Fraction(1, 2)),
                LevelMeasure("d", "g", Identity(chars), None, Fraction(1, 2)))
    with pytest.raises(ParameterError, match="'g' is a geography attribute"):
        TopDown(TopDownParams(GeographySpec(("g",), parents="nested"), measures)).plan(domain, ConstraintSet(domain), RHO)
    with pytest.raises(ParameterError, match="level 'g' has no measurement"):
        TopDownParams(GeographySpec(("g",), parents="nested"),
                      (LevelMeasure("d", "nation", Identity(chars), None, Fraction(1)),))
    with pytest.raises(ParameterError, match="not a level of the geography"):
        TopDownParams(GeographySpec(("g",), parents="nested"),
                      (LevelMeasure("d", "county", Identity(chars), None, Fraction(1)),))
    with pytest.raises(ParameterError, match="shares sum to 1/2"):
        TopDownParams(GeographySpec(("g",), parents="nested"),
                      (LevelMeasure("d", "nation", Identity(chars), None, Fraction(1, 4)),
                       LevelMeasure("d", "g", Identity(chars), None, Fraction(1, 4))))


SPEC = """
name = "td"
algorithm = "topdown"
[domain]
builtin = "census"
states = 2
counties_per_state = 2
[data]
rows = 800
[privacy]
accounting = "zcdp"
rho = 1
[geography]
levels = ["state", "county"]
[[measure]]
level = "nation"
query = "identity"
share = 0.2
[[measure]]
level = "state"
query = "identity"
share = 0.3
[[measure]]
level = "county"
query = "identity"
share = 0.3
[[measure]]
level = "county"
query = "marginal"
attrs = ["sex"]
share = 0.2
[topdown]
executor = "serial"
[constraints]
nonnegative = true
integer = true
structural_zeros = [{ builtin = true }]
[output]
formats = ["csv"]
summary = ["md"]
plots = false
"""


NATION = "[[measure]]\nlevel = \"nation\"\nquery = \"identity\"\nshare = 0.2\n"


@pytest.mark.parametrize("change, key, words", [
    ([("level = \"county\"\nquery = \"marginal\"", "level = \"town\"\nquery = \"marginal\"")], "measure[4].level",
     "unknown value 'town'"),
    ([("attrs = [\"sex\"]", "attrs = [\"county\"]")], "measure[4].attrs", "'county' is a geography attribute"),
    ([("share = 0.2\n[topdown]", "share = 0.1\n[topdown]")], "measure[4].share", "sum to 9/10"),
    ([("levels = [\"state\", \"county\"]", "levels = [\"state\", \"county\"]\nparents = \"by magic\"")],
     "geography.parents", "unknown value 'by magic'"),
    ([("executor = \"serial\"", "executor = \"gpu\"")], "topdown.executor", "unknown value 'gpu'"),
    # With the upward pass only the last level must be measured (the others are estimated from it) ...
    ([("level = \"county\"\nquery = \"identity\"", "level = \"state\"\nquery = \"total\""),
      ("level = \"county\"\nquery = \"marginal\"", "level = \"state\"\nquery = \"marginal\"")],
     "measure[1].level", "level 'county' has no [[measure]]; the last level needs at least one"),
    # ... without it, every level.
    ([(NATION, NATION.replace("nation", "state").replace("identity", "total")),
      ("executor = \"serial\"", "executor = \"serial\"\nupward = false")],
     "measure[1].level", "level 'nation' has no [[measure]]; with upward = false every level"),
    ([(NATION, NATION.replace("share = 0.2\n", ""))], "measure[2].share", "give a share in every [[measure]] or in none"),
    ([(NATION, NATION + "weight = 2\n")], "measure[1].weight", "weight only applies when the split is chosen"),
])
def test_spec_errors_name_the_key_and_line(tmp_path, change, key, words):
    from dpopt.release import plan
    from dpopt.spec import parse_spec_text

    text = SPEC
    for old, new in change:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "td.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        plan(parse_spec_text(text, source=path))
    message = str(info.value)
    assert key in message and words in message and "line" in message


def test_a_spec_release_writes_every_level_table(tmp_path):
    from dpopt.release import run
    from dpopt.spec import parse_spec_text

    release = run(parse_spec_text(SPEC), out=tmp_path / "out", seed=2)
    assert release.success and release.algorithm == "topdown"
    files = sorted(p.name for p in (tmp_path / "out" / "marginals").iterdir())
    assert files == ["county_marginal_sex.csv", "level_county.csv", "level_nation.csv", "level_state.csv"]
    # Every measured table's noisy answers, beside its answers on the released table (as a flat release's).
    sex = read_released(tmp_path / "out" / "marginals" / "county_marginal_sex.csv")
    assert list(sex.columns) == ["county", "sex", "count", "noisy"] and len(sex) == 4 * 2
    table = release.level_tables["county"].reshape(4, 6, 2, 6, 5)
    assert sex["count"].tolist() == table.sum(axis=(1, 3, 4)).ravel().tolist()
    assert sex["noisy"].tolist() == release.noisy["county"]["marginal(sex)"].ravel().tolist()
    county = read_released(tmp_path / "out" / "marginals" / "level_county.csv")
    state = read_released(tmp_path / "out" / "marginals" / "level_state.csv")
    assert len(county) == 4 * 360 and set(county.columns) >= {"county", "age_group", "count", "noisy"}
    county["state"] = county["county"].str.split("-").str[0]
    summed = county.groupby(["state", "age_group", "sex", "relationship", "household_type"])["count"].sum()
    assert summed.sort_index().to_numpy().tolist() == \
        state.set_index(["state", "age_group", "sex", "relationship", "household_type"])["count"].sort_index().tolist()
    report = release.report["algorithm"]
    assert [lv["level"] for lv in report["levels"]] == ["nation", "state", "county"]
    assert release.report["constraints_all_hold"]


def test_the_builtin_census_topdown_spec_plans_three_levels():
    from dpopt.release import plan

    p = plan("census_topdown")
    assert p.algorithm.name == "topdown"
    assert p.algorithm_plan.details.geography.names == ("nation", "state", "county")
    text = p.describe()
    assert "geography: nation (1) → state (4; 4-4 per nation) → county (12; 3-3 per state)" in text
    assert "county: detailed" in text


# ---- readers and evaluation ------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_the_chunked_reader_counts_like_the_dataset(tmp_path, fmt):
    from dpopt.algorithms.topdown.readers import read_unit_counts
    from dpopt.datasets.census import census_domain, generate_census

    domain = census_domain(2, 2)
    frame = generate_census(1200, num_states=2, counties_per_state=2, seed=4)
    path = tmp_path / f"people.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path, index=False)
    geography = Geography.from_columns(domain, ["state", "county"])
    counts = read_unit_counts(path, geography, domain, chunksize=250)
    expected = geography.leaf_histograms(Dataset.from_frame(frame, domain))
    assert (counts != expected).nnz == 0 and counts.sum() == 1200


def test_error_by_unit_size_and_the_bottom_up_baseline():
    from dpopt.algorithms.topdown.evaluate import bottom_up, error_by_unit_size

    release = run_census("serial", seed=3)
    domain, data, _ = census_case()
    geography, chars = release.geography, release.characteristics
    leaf = geography.leaf_histograms(data)
    base = bottom_up(geography, chars, leaf, RHO, SeededRandom(3))
    noisy = {name: release.noisy[name]["detailed"] for name in geography.names}
    frame = error_by_unit_size(geography, leaf, {"topdown": release.level_tables, "noisy": noisy, "bottom-up": base})
    assert list(frame["level"].unique()) == ["nation", "state", "county"]
    assert frame.groupby("level", sort=False)["units"].sum().tolist() == [1, 2, 6]
    assert {"mae_topdown", "mae_noisy", "mae_bottom-up"} <= set(frame.columns)
    # bottom-up levels are sums of the noisy leaves
    assert np.allclose(base["nation"], base["county"].sum(axis=0))


def nation_like_root():
    """A nation-like root task: 330 million persons over 1,512 cells, noise of s.d. 3 to 7 (test
    data and test noise, not privacy noise); with its truth and the 'halves' invariant matrix."""
    from dpopt.algorithms.topdown.solve import ParentTask, TaskInvariant, TaskQuery

    gen = np.random.default_rng(11)
    n = 1512
    shares = gen.lognormal(0.0, 2.0, n)
    truth = np.round(shares / shares.sum() * 330e6)
    cells = np.arange(n)

    def grouping(labels):
        return sp.csr_matrix((np.ones(n), (labels, cells)), shape=(int(labels.max()) + 1, n))

    queries = []
    for label, matrix, sigma in (("detailed", sp.identity(n, format="csr"), 2.9), ("pairs", grouping(cells // 6), 5.0),
                                 ("total", grouping(np.zeros(n, dtype=int)), 7.1), ("eighths", grouping(cells % 8), 7.1)):
        noisy = matrix @ truth + gen.normal(0.0, sigma, matrix.shape[0])
        queries.append(TaskQuery(label, matrix, noisy[None, :], "gaussian", sigma, sigma**2))
    halves = grouping(cells % 2)
    invariant = TaskInvariant("halves", halves, np.array([0]), (halves @ truth)[None, :])
    task = ParentTask(0, -1, "nation", np.array([0]), cells, None, tuple(queries), (invariant,),
                      options=SolveOptions(keep_fractional=True))
    return task, truth, halves


def test_a_root_of_hundreds_of_millions_is_fitted_within_its_noise():
    """The problem is centred on the noisy table, and the bound x >= 0 of the large cells must not
    set the solver's count scale (it did: the nation's fit was 55 persons per cell from its noisy
    answers). The fit's residuals are those of a least-squares fit (below the noise), and the
    release beats its noisy answers."""
    from dpopt.algorithms.topdown.solve import solve_parent

    task, truth, halves = nation_like_root()
    assert truth.max() > 1e7
    solution = solve_parent(task)
    assert solution.status is Status.OPTIMAL, solution.message
    assert "raised" not in solution.message
    noisy = task.queries[0].values[0]
    assert np.sqrt(np.mean((solution.fractional[0] - noisy) ** 2)) < 2.9
    assert np.abs(solution.table[0] - truth).mean() < np.abs(noisy - truth).mean()
    assert np.array_equal(halves @ solution.table[0], halves @ truth) and (solution.table[0] >= 0).all()


def test_when_a_tightened_bound_binds_the_root_is_solved_as_it_is(monkeypatch):
    """With a margin so small that the tightened bounds bind (or cannot hold), the problem is
    solved again with x >= 0 as it is: still a release that keeps every constraint."""
    from dpopt.algorithms.topdown import solve

    task, truth, halves = nation_like_root()
    monkeypatch.setattr(solve, "CENTRE_MARGIN", 2.0**-40)
    solution = solve.solve_parent(task)
    assert solution.status is Status.OPTIMAL, solution.message
    assert np.array_equal(halves @ solution.table[0], halves @ truth) and (solution.table[0] >= 0).all()


def test_a_rounding_stopped_at_its_time_limit_releases_its_checked_incumbent(monkeypatch):
    """Bounded rounding may stop with an incumbent that keeps every constraint (status TIME_LIMIT):
    the parent's table is released (and verified again), and the level's report says so."""
    import dpopt.estimate

    baseline = run_census("serial")
    real = dpopt.estimate.round_to_integers

    def stopped(*args, **kwargs):
        result = real(*args, **kwargs)
        result.update(status=Status.TIME_LIMIT, success=False, incumbent=True,
                      message="time limit reached; gap 0.5 %")
        return result

    monkeypatch.setattr(dpopt.estimate, "round_to_integers", stopped)  # solve.py imports it at each call
    release = run_census("serial")
    assert release.success, release.message
    for name in baseline.level_tables:
        assert np.array_equal(release.level_tables[name], baseline.level_tables[name])
    for level in release.info["levels"]:
        assert level["backend_fallbacks"] and all("TIME_LIMIT" in f for f in level["backend_fallbacks"])


def test_pool_workers_do_not_outlive_a_killed_release(tmp_path):
    """SIGKILL runs no clean-up: the pool's workers must still stop (Linux: PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    pids = tmp_path / "pids"
    script = f"""
import os, time
from dpopt.algorithms.topdown.executors import PoolExecutor

def work(_):
    with open({str(pids)!r}, "a") as fh:
        fh.write(f"{{os.getpid()}}\\n")
    time.sleep(120)

PoolExecutor(workers=2).map(work, [0, 1])
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
            time.sleep(0.1)
        workers = [int(p) for p in pids.read_text().split()]
        assert len(workers) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open(f"/proc/{pid}/stat") as fh:  # a zombie waiting for its reaper is not running
            return fh.read().split(")")[-1].split()[0] != "Z"

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in workers):
        time.sleep(0.1)
    assert not any(alive(p) for p in workers)
