"""Wide data from specs (issue 27): ``marginal_space`` and ``mwem_factored`` on 30 binary
attributes (10^9 cells) plan and run without ever allocating the full table; the planning and
memory checks ask the algorithm what it holds; the shipped example specs plan."""

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dpopt.algorithms.mwem_factored import default_rounds
from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.errors import SolverError, SpecError
from dpopt.model.data import Dataset
from dpopt.release import plan, run
from dpopt.release.resources import ResourceLimitError, estimate_memory

from .conftest import shared_data

MODELS = Path(__file__).resolve().parents[1] / "models"
D = 30
#: The dense table of 30 binary attributes would take 8 GiB as float64; the runs stay far below this.
PEAK_BYTES = 200 * 2**20


@pytest.fixture(scope="module")
def wide():
    net = random_sparse_network(D, seed=4)
    return net, net.sample(4000, 5)


def spec_of(net, algorithm, **tables):
    return {"name": "wide", "algorithm": algorithm, "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "constraints": {"nonnegative": True, "integer": True},
            "output": {"formats": ["csv"], "synthetic": True}, **tables}


def run_measuring_memory(spec, data):
    tracemalloc.start()
    try:
        release = run(spec, data=data, seed=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return release, peak


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_marginal_space_spec_runs_on_30_attributes_without_the_table(wide):
    net, data = wide
    spec = spec_of(net, "marginal_space", privacy={"accounting": "zcdp", "rho": 0.5},
                   measure=[{"label": "pairs", "query": "all_marginals", "k": 2, "mechanism": "gaussian", "share": 1}],
                   marginal_space={"shrink": True})
    release, peak = run_measuring_memory(spec, data)
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    assert release.success and release.counts is None and release.table is None
    assert release.reconstruction.info["polytope"] == "local"
    assert release.reconstruction.info["shrinkage"][2]["shrinkage"] >= 0  # [marginal_space] shrink reached it
    assert len(release.answers) == D * (D - 1) // 2
    frame = release.answers["x003, x004"]
    n = round(release.reconstruction.total)  # the record count is estimated (noisy), not the data's
    assert frame["count"].dtype.kind == "i" and frame["count"].sum() == len(release.synthetic) == n
    # integer marginals are the records': consistent, summing to the record count
    records = Dataset.from_frame(release.synthetic, net.domain)
    np.testing.assert_array_equal(frame["count"].to_numpy(), records.marginal(["x003", "x004"]))
    np.testing.assert_allclose(frame["fitted"].sum(), release.reconstruction.total)
    assert "noisy" in frame
    p = release.plan
    item = estimate_memory(p).largest
    assert item.what == "the marginal-space estimate" and 0 < item.bytes < 50 * 2**20


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_mwem_factored_spec_runs_on_30_attributes_without_the_table(wide):
    net, data = wide
    spec = spec_of(net, "mwem_factored", privacy={"accounting": "pure", "epsilon": 1.0}, mwem_factored={"ways": 2})
    p = plan(spec, data=data)
    rounds = default_rounds("pure", 1, D)
    assert rounds == 60 and sum(step.label.endswith("measure") for step in p.steps) == rounds
    spec["mwem_factored"]["rounds"] = 12  # the run itself with fewer rounds (tracemalloc slows it down)
    release, peak = run_measuring_memory(spec, data)
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    assert release.success and release.counts is None
    assert len(release.answers) == D * (D - 1) // 2 and len(release.synthetic) == data.total
    frame = release.answers["x000, x029"]
    assert frame["count"].sum() == data.total and (frame["fitted"] >= 0).all()


def test_the_domain_limit_applies_to_what_the_algorithm_holds(wide, monkeypatch):
    net, data = wide
    dense = spec_of(net, "measure_reconstruct", privacy={"accounting": "pure", "epsilon": 1.0},
                    measure=[{"query": "marginal", "attrs": ["x000", "x001"], "mechanism": "laplace", "share": 1}])
    with pytest.raises(SpecError, match="marginal_space"):
        plan(dense, data=data)
    wide_spec = spec_of(net, "marginal_space", privacy={"accounting": "zcdp", "rho": 0.5},
                        measure=[{"query": "all_marginals", "k": 2, "mechanism": "gaussian", "share": 1}],
                        marginal_space={"workload": 3})
    p = plan(wide_spec, data=data)
    assert "marginal space" in p.describe()
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", "1M")  # the 3-way workload's cells need far more
    with pytest.raises(ResourceLimitError, match="marginal-space estimate"):
        plan(wide_spec, data=data)


def test_default_rounds_rule():
    assert default_rounds("pure", 1, 27) == 54 and default_rounds("pure", 0.1, 16) == 17
    assert default_rounds("pure", 1e-4, 20) == 10 and default_rounds("pure", 1e6, 20) == 80
    assert default_rounds("zcdp", 0.5, 16) == default_rounds("pure", 1, 16)


@pytest.mark.parametrize("name, data", [("nltcs_mwem_factored", "nltcs.csv"),
                                        ("adult_marginal_space", "adult_pgm.csv")])
def test_shipped_wide_specs_plan(name, data):
    """models/nltcs_mwem_factored.toml and models/adult_marginal_space.toml (they run end to end in
    the shipped-spec test)."""
    p = plan(MODELS / f"{name}.toml", data=shared_data(data))
    text = p.describe()
    assert p.algorithm.name in ("mwem_factored", "marginal_space") and "memory" in text
    if name == "nltcs_mwem_factored":
        assert "32 rounds" in text
    else:
        assert p.domain.size > 10**17


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_auto_answers_a_workload_on_30_attributes_in_marginal_space(wide):
    """Issue 27 item 4: the workload-first plan takes the marginal-space estimator when the dense
    table does not fit, never allocating it, and fits better than its own noisy answers."""
    net, data = wide
    spec = {"name": "wide-auto", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "zcdp", "rho": 0.5},
            "workload": {"marginals": "all 2-way"}, "constraints": {"integer": True},
            "output": {"formats": ["csv"], "synthetic": True}}
    p = plan(spec, data=data)
    assert p.algorithm.name == "auto" and "beyond the dense table" in p.describe()
    # charged the marginal-space estimate (least squares, or the smooth estimate's bound), not a table
    assert "marginal-space estimate" in estimate_memory(p).largest.what
    release, peak = run_measuring_memory(spec, data)
    assert peak < PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    assert release.success and release.counts is None and release.info["marginal_space"]
    assert len(release.answers) == D * (D - 1) // 2
    assert release.info["wide_selection"]["mode"] == "all"  # zCDP: every workload marginal (wide_selection's rule)
    workload = [m for m in release.measurements if len(m.query.attrs) == 2]  # the one-way marginals besides
    assert len(workload) == D * (D - 1) // 2
    fitted_err, noisy_err = [], []
    for m in workload:
        frame = release.answers[m.label]
        truth = data.marginal(list(m.query.attrs))
        assert frame["count"].dtype.kind == "i" and (frame["fitted"] >= -1e-9).all()
        fitted_err.append(np.abs(frame["fitted"].to_numpy() - truth).mean())
        noisy_err.append(np.abs(m.values - truth).mean())
    assert np.mean(fitted_err) < np.mean(noisy_err)   # consistency helps on average over the 435 tables


def test_auto_refuses_ranges_beyond_the_dense_table(wide):
    net, data = wide
    spec = {"name": "wide-auto", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "pure", "epsilon": 1},
            "workload": {"ranges": ["x000"]}}
    with pytest.raises(SpecError, match="ranges need the table"):
        plan(spec, data=data)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_auto_total_reaches_the_wide_estimate_and_the_report(wide):
    """``[auto] total`` is the marginal-space estimator's ``total=`` beyond the dense table; the
    release's info, report.json and notes carry the choice."""
    net, data = wide
    pairs = [list(net.domain.attrs[i:i + 2]) for i in range(0, 8, 2)]
    spec = {"name": "wide-auto-total", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "zcdp", "rho": 0.5},
            "workload": {"marginals": pairs}, "auto": {"total": "measured"}}
    release = run(spec, data=data, seed=2)
    assert release.success and release.info["marginal_space"]
    chosen = release.reconstruction.info["total"]
    assert release.info["total"] == chosen and chosen["mode"] == "measured" and chosen["held"]
    assert release.reconstruction.total == pytest.approx(chosen["measured"], rel=1e-9)
    assert release.report["algorithm"]["total"]["reason"] == chosen["reason"]
    assert any(n.startswith("Record count ([auto] total = 'measured')") for n in release.notes)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("algorithm", ["auto", "marginal_space"])
def test_an_uncertified_estimate_releases_nothing_and_says_so(wide, algorithm, monkeypatch, tmp_path):
    """A solve that does not certify is not an estimate: the run raises one line naming the status
    and saying that nothing was released (the CLI prints it), and writes nothing."""
    import dpopt.estimate.marginal_space.estimator as estimator

    real = estimator.project

    def uncertified(problem, **kwargs):  # the real solve, then its certificate withheld
        out = real(problem, **kwargs)
        out.converged, out.stopped = False, "L-BFGS-B: a test's stop; the polish did not certify"
        return out

    monkeypatch.setattr(estimator, "project", uncertified)
    net, data = wide
    pairs = [list(net.domain.attrs[i:i + 2]) for i in range(0, 8, 2)]
    if algorithm == "auto":
        spec = {"name": "wide-auto", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
                "data": {"source": "file"}, "privacy": {"accounting": "zcdp", "rho": 0.5},
                "workload": {"marginals": pairs}, "auto": {"estimator": "l2"}}  # the projection's certificate
    else:
        spec = spec_of(net, "marginal_space", privacy={"accounting": "zcdp", "rho": 0.5},
                       measure=[{"query": "marginal", "attrs": p, "mechanism": "gaussian", "share": "1/4"}
                                for p in pairs], marginal_space={"objective": "l2"})
    with pytest.raises(SolverError) as err:
        run(spec, data=data, seed=2, out=tmp_path / "release")
    assert not (tmp_path / "release").exists()
    text = str(err.value)
    assert "\n" not in text and f"key '{algorithm}'" in text
    assert "not certified (NUMERICAL_ERROR), so nothing was released" in text and "duality gap" in text


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_auto_releases_all_triples_of_27_attributes_at_pure_eps_0_1():
    """The case that ended NUMERICAL_ERROR (s27h): auto's wide plan on the 27-attribute network of
    bench_wide, every triple, pure ε = 0.1, seed 7 (81 measurements; the total is left free). It failed
    because ``projection.project`` never polished again once a first polish had not certified."""
    net = random_sparse_network(27, seed=1)
    data = net.sample(50_000, 2)
    spec = {"name": "bn27-auto", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "pure", "epsilon": 0.1},
            "workload": {"marginals": "all 3-way"}, "auto": {"estimator": "l2"}}  # the projection's certificate
    release = run(spec, data=data, seed=7)
    assert release.success and not release.info["total"]["held"]
    assert release.reconstruction.info["certificate"]["gap"] <= 1e-9


# ---- can the fit of "all" finish? (wide_selection.measure_all_fit, decided before any draw) ---------------
#: Adult's sizes (adult_pgm_domain.json, public): every triple's local relaxation holds 20,894,536 cells.
ADULT_SIZES = {"age": 85, "workclass": 9, "fnlwgt": 100, "education-num": 16, "marital-status": 7, "occupation": 15,
               "relationship": 6, "race": 5, "sex": 2, "capital-gain": 100, "capital-loss": 100,
               "hours-per-week": 99, "native-country": 42, "income>50K": 2}


def adult_auto_spec(workload, **auto):
    return {"name": "adult-auto", "domain": {"attributes": dict(ADULT_SIZES)}, "data": {"source": "file"},
            "privacy": {"accounting": "zcdp", "rho": 0.5}, "workload": {"marginals": workload},
            **({"auto": auto} if auto else {})}


def test_all_3_way_on_adult_plans_selection_only_and_says_why():
    """A user who names every triple of adult gets a plan in which "all" is excluded before any
    draw (no data is read): least squares on 20.9 M clique cells is beyond ALL_L2_CELLS; the
    plan's text (``dpopt check``) gives the reason and the limit."""
    from itertools import combinations
    from math import prod

    from dpopt.strategy.wide_selection import ALL_L2_CELLS

    p = plan(adult_auto_spec("all 3-way"), require_data=False)
    fit = p.algorithm_plan.details.selection.all_fit
    cells = sum(prod(ADULT_SIZES[a] for a in t) for t in combinations(ADULT_SIZES, 3))  # every triple is maximal
    assert not fit.fits and fit.objective == "l2" and fit.cells == cells == 20_894_536 > ALL_L2_CELLS
    text = p.describe()
    assert "measuring every workload marginal is excluded" in text and f"ALL_L2_CELLS = {ALL_L2_CELLS:,}" in text
    assert "20,894,536 clique cells" in text


@pytest.mark.parametrize("workload, estimator, objective, fits", [
    ("all 2-way", "auto", "l2", True),     # the tree is the whole domain; 148,137 clique cells
    ("chain", "auto", "smooth", True),     # decomposable: the smooth estimate on a tree of 1,540,036 cells
    ("chain", "l2", "l2", True)])          # least squares on the same 1,540,036 clique cells: decomposable, within
def test_the_rule_on_adult_workloads(workload, estimator, objective, fits):         # DECOMPOSABLE_L2_CELLS
    attrs = list(ADULT_SIZES)
    sets = [attrs[i:i + 3] for i in range(len(attrs) - 2)] if workload == "chain" else workload
    p = plan(adult_auto_spec(sets, estimator=estimator), require_data=False)
    fit = p.algorithm_plan.details.selection.all_fit
    assert fit.fits == fits and fit.objective == objective
    assert fit.cells == (148_137 if workload == "all 2-way" else 1_540_036)
    assert f"measuring every workload marginal is {'allowed' if fits else 'excluded'}" in p.describe()


def test_the_rule_reads_sizes_only_and_bounds_forced_smooth():
    """The rule's inputs are the domain's sizes, the sets and the fit's options; a forced smooth
    fit whose tree exceeds SMOOTH_TREE_CELLS leaves selection only; a declared constraint the
    smooth estimate cannot keep sends "auto" to least squares and its cell limit."""
    from dpopt.model.domain import Domain
    from dpopt.strategy.wide_selection import ALL_L2_CELLS, measure_all_fit

    domain = Domain(tuple(f"a{i}" for i in range(8)), (64,) * 8)  # 64^8 cells; each triple 262,144
    pairs = [(f"a{i}", f"a{i + 1}") for i in range(7)]
    assert measure_all_fit(domain, pairs).objective == "smooth"
    triples = [(f"a{i}", f"a{j}", f"a{k}") for i in range(8) for j in range(i + 1, 8) for k in range(j + 1, 8)]
    assert 56 * 262_144 > ALL_L2_CELLS
    for objective in ("auto", "l2", "smooth"):
        fit = measure_all_fit(domain, triples, objective=objective)
        assert not fit.fits, objective
    k = ALL_L2_CELLS // 262_144
    first = triples[:k]  # cyclic triples holding every attribute: exactly the limit, then one triple over it
    assert k < len(triples) and {a for t in first for a in t} == set(domain.attrs)
    assert measure_all_fit(domain, first, objective="l2").cells == k * 262_144 == ALL_L2_CELLS
    assert measure_all_fit(domain, first, objective="l2").fits
    assert not measure_all_fit(domain, first + [triples[k]], objective="l2").fits


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_excluded_all_runs_selection_where_the_probe_would_measure_all(monkeypatch):
    """Same data, seed and budget (so large the probe chooses "all"): with the fit of "all" beyond
    ALL_L2_CELLS the run selects instead, the ledger is the same and the reason is given; with the
    limit raised it measures all. 10 attributes of 33 values: every triple's relaxation holds
    4.31 M cells."""
    from fractions import Fraction
    from itertools import combinations

    from dpopt.model.domain import Domain
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy import wide_selection as ws

    domain = Domain(tuple(f"b{i}" for i in range(10)), (33,) * 10)
    gen = np.random.default_rng(3)
    codes = (gen.integers(0, 33, size=(3000, 1)) + gen.integers(0, 3, size=(3000, 10))) % 33  # dependent columns
    data = Dataset(codes, domain)
    sets = list(combinations(domain.attrs, 3))
    budget = Budget.zcdp(Fraction(10**6))
    runs, default = {}, ws.ALL_L2_CELLS
    assert 120 * 33**3 > default
    for limit in (default, 10**7):
        monkeypatch.setattr(ws, "ALL_L2_CELLS", limit)
        selection_plan = ws.plan_wide_selection(domain, sets, budget, "gaussian")
        assert selection_plan.all_fit.fits == (limit == 10**7) and selection_plan.all_fit.cells == 120 * 33**3
        accountant = budget.accountant()
        runs[limit] = ws.run_wide_selection(selection_plan, data, accountant, make_random(5))
        assert accountant.spent.rho == budget.rho  # the ledger sums exactly either way
    excluded, allowed = runs[default], runs[10**7]
    assert allowed.mode == "all" and allowed.expected_noise_all <= allowed.deviation  # the probe's own choice
    assert excluded.mode == "select" and len(excluded.chosen) >= 1
    # Each pick is measured only while the fit of the measured sets stays in reach (the guard of
    # step 3): here the tree of the chosen triples outgrows SMOOTH_TREE_CELLS, and least squares
    # would hold every triple (4.31 M cells, cyclic), so later picks are refused, not measured.
    ones = [(a,) for a in domain.attrs]
    monkeypatch.setattr(ws, "ALL_L2_CELLS", default)
    assert ws.fit_in_reach(domain, ones + excluded.chosen, sets).fits
    assert excluded.refused and all(not ws.fit_in_reach(domain, ones + excluded.chosen[:k] + [c], sets).fits
                                    for c, _, k in excluded.refused)
    assert excluded.deviation == allowed.deviation  # the same draws up to the decision
    assert "excluded before any draw" in excluded.describe() and "ALL_L2_CELLS" in excluded.describe()
    assert excluded.info()["all_fit"]["fits"] is False


def test_an_explicit_spec_beyond_the_least_squares_limit_is_warned_in_its_plan():
    """An explicit ``[marginal_space]`` spec measuring every triple of adult (least squares on
    20.9 M clique cells, beyond ALL_L2_CELLS) is the user's choice: its plan (``dpopt check``)
    says, before any draw, that such a fit did not certify in bounded time and would then release
    nothing. Every pair of adult (below the limit, the shipped spec's measurements) and adult's chain
    of triples (1.54 M cells, decomposable: it certifies) are not warned."""
    from dpopt.strategy.wide_selection import ALL_L2_CELLS

    def explicit(measure):
        return {"name": "adult-explicit", "domain": {"attributes": dict(ADULT_SIZES)}, "data": {"source": "file"},
                "privacy": {"accounting": "zcdp", "rho": 0.5}, "algorithm": "marginal_space",
                "measure": measure, "marginal_space": {"objective": "l2"}}

    def every(k):
        return explicit([{"label": f"{k}-way", "query": "all_marginals", "k": k, "mechanism": "gaussian", "share": 1}])

    names = list(ADULT_SIZES)
    chain = explicit([{"label": f"chain {i}", "query": "marginal", "attrs": names[i:i + 3], "mechanism": "gaussian",
                       "share": 1 / 12 if i < 11 else 1 - 11 / 12} for i in range(12)])

    text = plan(every(3), require_data=False).describe()
    assert f"warning: least squares: its local relaxation would hold 20,894,536 clique cells of cyclic sets, above " \
           f"ALL_L2_CELLS = {ALL_L2_CELLS:,}" in text
    assert "releases nothing, after the budget is spent" in text
    assert "warning: least squares" not in plan(every(2), require_data=False).describe()
    chain_cells = sum(ADULT_SIZES[a] * ADULT_SIZES[b] * ADULT_SIZES[c] for a, b, c in zip(names, names[1:], names[2:]))
    chain_text = plan(chain, require_data=False).describe()
    assert f"({chain_cells:,} cells)" in chain_text
    assert "warning: least squares" not in chain_text


# ---- session 8: one rule for least squares, the selection's guard, the memory line, the one-way fallback ---------
def test_one_least_squares_rule_with_two_limits_for_all_and_for_the_explicit_warning():
    """least_squares_reach: cyclic sets up to ALL_L2_CELLS, decomposable ones up to
    DECOMPOSABLE_L2_CELLS, cells counted by hand (pairs of 512-value attributes: 2^18 cells each);
    measure_all_fit and the marginal_space warning give the same answer on the same sets."""
    from dpopt.algorithms.marginal_space import least_squares_size_warning
    from dpopt.estimate.marginal_space.estimator import ObjectiveChoice
    from dpopt.model.domain import Domain
    from dpopt.strategy import wide_selection as ws

    pair = 512 * 512
    kc, kd = ws.ALL_L2_CELLS // pair, ws.DECOMPOSABLE_L2_CELLS // pair  # pairs at each limit
    names = tuple(f"p{i}" for i in range(max(kc, kd) + 2))

    def cycle(k):  # a k-cycle (k >= 4): not chordal
        return [(names[i], names[(i + 1) % k]) for i in range(k)]

    def chain(k):  # a path: chordal, its edges the cliques
        return [(names[i], names[i + 1]) for i in range(k)]

    l2 = ObjectiveChoice("l2", "l2", "asked", None, None, False)
    assert kc >= 4 and kc * pair == ws.ALL_L2_CELLS and kd * pair == ws.DECOMPOSABLE_L2_CELLS
    for sets, cells, decomposable, fits in ((cycle(kc), kc * pair, False, True),
                                            (cycle(kc + 1), (kc + 1) * pair, False, False),
                                            (chain(kd), kd * pair, True, True),
                                            (chain(kd + 1), (kd + 1) * pair, True, False)):
        used = sorted({a for s in sets for a in s}, key=names.index)
        domain = Domain(tuple(used), (512,) * len(used))  # every attribute in a set: no loose one-way clique
        reach = ws.least_squares_reach(domain, sets)
        assert (reach.cells, reach.decomposable, reach.fits) == (cells, decomposable, fits), sets
        assert reach.limit == (ws.DECOMPOSABLE_L2_CELLS if decomposable else ws.ALL_L2_CELLS)
        assert cells == reach.limit or cells == reach.limit + pair  # at the limit, or one pair over it
        assert bool(least_squares_size_warning(domain, sets, l2)) == (not fits)
        name = "DECOMPOSABLE_L2_CELLS" if decomposable else "ALL_L2_CELLS"
        assert f"{name} = {reach.limit:,}" in reach.reason and "\n" not in reach.reason
    # measure_all_fit and fit_in_reach add the one-way marginals (inside the pairs here): the same answers
    assert ws.measure_all_fit(Domain(names[:kc], (512,) * kc), cycle(kc), objective="l2").fits
    assert not ws.measure_all_fit(Domain(names[:kc + 1], (512,) * (kc + 1)), cycle(kc + 1), objective="l2").fits
    assert ws.measure_all_fit(Domain(names[:kd + 1], (512,) * (kd + 1)), chain(kd), objective="l2").fits
    longer = chain(kd + 1)
    assert not ws.fit_in_reach(Domain(names[:kd + 2], (512,) * (kd + 2)), longer + [(a,) for a in names[:kd + 2]],
                               longer, objective="l2").fits


def test_a_plan_whose_every_selection_would_be_least_squares_out_of_reach_is_refused_before_any_draw():
    """Every triple of adult with estimator = 'l2': whatever is selected, least squares holds every
    workload triple (20.9 M clique cells of cyclic sets), so no fit can finish: refused in the plan,
    in one line naming the limit (before, the plan ran selection and its fit could not finish)."""
    from dpopt.strategy.wide_selection import ALL_L2_CELLS

    with pytest.raises(SpecError) as err:
        plan(adult_auto_spec("all 3-way", estimator="l2"), require_data=False)
    text = str(err.value)
    assert "\n" not in text and "no selection's fit can finish" in text
    assert f"20,894,536 clique cells of cyclic sets, above ALL_L2_CELLS = {ALL_L2_CELLS:,}" in text


@pytest.mark.parametrize("workload, l2_cells", [("all 3-way", 0), ("all 2-way", 148_137)])
def test_the_memory_line_charges_what_the_plan_can_hold(workload, l2_cells):
    """dpopt check's memory line for auto's wide plan on adult: every least-squares fit is held to
    fit_in_reach, so with every triple (least squares out of reach: none runs) it charges the smooth
    estimate's tree, not 20.9 M least-squares cells (4.4 GiB); with every pair (148,137 cells, in
    reach) least squares on them. Beside the fit, the released answers: every workload cell."""
    from dpopt.algorithms.auto import ANSWER_BYTES_PER_CELL
    from dpopt.algorithms.marginal_space import SOLVER_BYTES_PER_CELL, TREE_BYTES_PER_CELL
    from dpopt.estimate.marginal_space.estimator import SMOOTH_TREE_CELLS

    p = plan(adult_auto_spec(workload), require_data=False)
    details = p.algorithm_plan.details
    assert details.l2_cells == l2_cells
    rows = p.algorithm.memory(p.algorithm_plan)
    assert len(rows) == 2
    workload_cells = sum(p.domain.project(list(s)).size for s in details.sets)
    assert rows[1][0] == "the released answer tables" and rows[1][2] == workload_cells * ANSWER_BYTES_PER_CELL
    assert workload_cells == details.cells
    tree = min(details.tree_cells, SMOOTH_TREE_CELLS)
    assert rows[0][2] == max(l2_cells * SOLVER_BYTES_PER_CELL, tree * TREE_BYTES_PER_CELL)
    if workload == "all 3-way":
        assert rows[0][2] <= SMOOTH_TREE_CELLS * TREE_BYTES_PER_CELL < 20_894_536 * SOLVER_BYTES_PER_CELL


def test_the_one_way_fallback_is_open_only_where_no_top_up_pays():
    """The fallback's public condition against the top-up's expected error evaluated on the grid by
    hand (pure ε, phi = 1): many-valued attributes (no top-up pays: the fallback is open) and binary
    pairs (a top-up pays: closed); model_noise against a loop over the candidates."""
    from itertools import combinations

    from dpopt.model.domain import Domain
    from dpopt.privacy.budget import Budget
    from dpopt.strategy import wide_selection as ws

    def grid_argmin(domain, candidates, rounds):
        d = len(domain.attrs)
        s, r = float(ws.ONE_WAY_SHARE), float(1 - ws.PROBE_SHARE)
        one = np.mean([sum(domain.sizes[domain.attrs.index(a)] for a in c) for c in candidates])
        cells = np.mean([np.prod([domain.sizes[domain.attrs.index(a)] for a in c]) for c in candidates])
        x = np.arange(0, round((r - s) * 1000)) / 1000.0
        f = d * one / np.sqrt(s * s + x * x) + cells * rounds / float(1 - ws.SELECT_SHARE) / (r - s - x)
        return x[int(np.argmin(f))]

    many = Domain(tuple(f"g{i}" for i in range(14)), (2, 128, 8, 2, 128, 16, 2, 4, 64, 2, 128, 8, 2, 2))
    binary = Domain(tuple(f"x{i}" for i in range(50)), (2,) * 50)
    for domain, k, open_ in ((many, 3, True), (binary, 2, False)):
        sets = list(combinations(domain.attrs, k))
        p = ws.plan_wide_selection(domain, sets, Budget.pure(1), "laplace")
        assert p.one_way_fallback == open_ == (grid_argmin(domain, p.candidates, p.rounds) == 0)
        assert any("no second one-way measurement pays" in line for line in p.lines()) == open_
    candidates = [("g0", "g1"), ("g1", "g4", "g8"), ("g2", "g3", "g5")]
    total, noise = 1000.0, 3.5
    by_hand = np.mean([min(sum(many.sizes[many.attrs.index(a)] for a in c) * noise, 2 * total) for c in candidates])
    assert ws.model_noise(many, candidates, noise, total) == pytest.approx(by_hand, rel=1e-15)
    assert ws.model_noise(many, candidates, 100.0, total) == 2 * total  # every term capped


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_one_way_fallback_run_spends_the_rest_on_the_one_way_marginals():
    """Many-valued attributes at pure ε 0.1 (bench_wide_rule.py --groups' domain, 4,000 records):
    the one-way model's expected noise exceeds the probe's deviation, so the rest measures the
    one-way marginals again; the ledger sums exactly to the budget; forcing selection instead
    spends the same budget."""
    from fractions import Fraction
    from itertools import combinations

    from dpopt.model.domain import Domain
    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy import wide_selection as ws

    groups = (1, 7, 3, 1, 7, 4, 1, 2, 6, 1, 7, 3, 1, 1)
    binary = random_sparse_network(45, seed=3).sample(4000, 103).codes
    edges = np.concatenate([[0], np.cumsum(groups)])
    codes = np.stack([binary[:, a:b] @ (1 << np.arange(b - a)[::-1]) for a, b in zip(edges[:-1], edges[1:])], 1)
    domain = Domain(tuple(f"g{i}" for i in range(14)), tuple(2**g for g in groups))
    data = Dataset(codes, domain)
    sets = list(combinations(domain.attrs, 3))
    budget = Budget.pure(Fraction(1, 10))
    p = ws.plan_wide_selection(domain, sets, budget, "laplace")
    assert p.one_way_fallback
    accountant = budget.accountant()
    out = ws.run_wide_selection(p, data, accountant, make_random(3))
    assert out.mode == "one-way" and out.steer >= 1 and not out.chosen
    assert len(out.measurements) == 2 * len(domain.attrs)                       # the one-way marginals, twice
    assert sum(accountant.ledger_frame()["epsilon"], Fraction(0)) == Fraction(1, 10)
    assert "selection could not pay for its noise" in out.describe()
    forced = budget.accountant()
    ws.run_wide_selection(p, data, forced, make_random(3), mode="select")
    assert sum(forced.ledger_frame()["epsilon"], Fraction(0)) == Fraction(1, 10)


def test_the_fallback_shares_minimise_the_workload_one_way_error():
    """one_way_weights against a grid over the simplex (step 1/500): the expected workload L1 of
    the one-way marginals measured alone, sum_a m_a n_a / epsilon_a, is least at shares
    proportional to sqrt(m_a n_a); an attribute in no workload set gets nothing; and the stack of
    every one-way marginal (scale d / epsilon on every cell) is never better."""
    from dpopt.model.domain import Domain
    from dpopt.strategy.wide_selection import one_way_weights

    domain = Domain(("a", "b", "c", "z"), (2, 8, 32, 5))
    workload = [("a", "b"), ("a", "c"), ("b", "c"), ("a", "b", "c"), ("c",)]
    m = np.array([3, 3, 4]); n = np.array([2, 8, 32])
    w = np.array(one_way_weights(domain, workload), dtype=float)
    assert w[3] == 0 and np.allclose(w[:3] / w[:3].sum(), np.sqrt(m * n) / np.sqrt(m * n).sum(), atol=1e-3)

    def error(shares):
        return float(np.sum(m * n / shares))

    x, y = np.meshgrid(np.arange(1, 500) / 500, np.arange(1, 500) / 500)
    keep = x + y < 1
    grid = np.stack([x[keep], y[keep], 1 - x[keep] - y[keep]], 1)
    best = min(np.sum(m * n / grid, axis=1))
    assert error(w[:3] / w[:3].sum()) <= best + 1e-9
    assert error(w[:3] / w[:3].sum()) <= 3 * float(np.sum(m * n))  # the stack: scale 3 / epsilon everywhere


def test_selection_is_blind_exactly_where_the_utility_bound_exceeds_every_deviation():
    """selection_is_blind against the closed form 2 ln|C| / epsilon >= 2 n^ (the exponential
    mechanism's utility bound at t = 0 against the largest L1 deviation of a table of total n^),
    on either side of the boundary; one candidate is never blind."""
    import math

    from dpopt.strategy.wide_selection import selection_is_blind

    total = 50_000.0
    for candidates in (2, 1225, 4950):
        edge = math.log(candidates) / total  # the epsilon at which 2 ln|C| / epsilon = 2 n^
        assert selection_is_blind(candidates, edge * (1 - 1e-9), total)
        assert not selection_is_blind(candidates, edge * (1 + 1e-9), total)
    assert not selection_is_blind(1, 1e-12, total)
    # d = 100 binary pairs at pure epsilon 0.1 with the plan's shares and the largest top-up: blind
    from fractions import Fraction
    from itertools import combinations

    from dpopt.model.domain import Domain
    from dpopt.privacy.budget import Budget
    from dpopt.strategy import wide_selection as ws

    domain = Domain(tuple(f"x{i}" for i in range(100)), (2,) * 100)
    p = ws.plan_wide_selection(domain, list(combinations(domain.attrs, 2)), Budget.pure(Fraction(1, 10)), "laplace")
    assert p.select_epsilon == Fraction(1, 10) * (1 - ws.ONE_WAY_SHARE - ws.PROBE_SHARE - Fraction(403, 1000)) \
        / 100 * ws.SELECT_SHARE
    assert selection_is_blind(len(p.candidates), p.select_epsilon, total)
    assert not selection_is_blind(len(p.candidates), 10 * p.select_epsilon, total)  # epsilon 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_blind_selection_falls_back_to_the_one_way_marginals(wide):
    """30 binary attributes, 4,000 records, pure ε 0.1: the first round's exponential mechanism
    (epsilon about 4e-4, 435 pair candidates) has a utility bound wider than any deviation
    (2 ln 435 / epsilon > 2 n^), so the rest measures the one-way marginals; the ledger is exact."""
    from fractions import Fraction
    from itertools import combinations

    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy import wide_selection as ws

    net, data = wide
    budget = Budget.pure(Fraction(1, 10))
    p = ws.plan_wide_selection(data.domain, list(combinations(data.domain.attrs, 2)), budget, "laplace")
    accountant = budget.accountant()
    out = ws.run_wide_selection(p, data, accountant, make_random(1))
    assert out.mode == "one-way" and out.blind and not out.chosen
    assert 2 * np.log(len(p.candidates)) / float(p.select_epsilon) >= 2 * out.total  # blind even at the plan's epsilon
    assert "utility bound exceeds any deviation" in out.describe() and out.info()["blind"] is True
    assert sum(accountant.ledger_frame()["epsilon"], Fraction(0)) == Fraction(1, 10)


# ---- which fit each mode gets (wide_selection.all_noise_fraction, decided before any draw) -----------
def test_the_all_or_select_rule_against_its_closed_form():
    """Plan level, no data: E_all = mean cells x E|z| of one marginal of the stack of every workload
    marginal with the rest of the budget (Gaussian: sqrt(2/pi) sigma, sigma^2 = M / (2 rho_rest);
    Laplace: b = M / epsilon_rest), and the share of the probe's deviation it may reach: 1/2
    (ALL_L2_NOISE_FRACTION) when the fit of "all" would be least squares, 1 when it is the smooth
    estimate. The decision flips exactly at E_all = fraction x D^."""
    import math
    from fractions import Fraction
    from itertools import combinations

    from dpopt.model.domain import Domain
    from dpopt.privacy.budget import Budget
    from dpopt.strategy import wide_selection as ws

    domain = Domain(tuple(f"a{i}" for i in range(27)), (2,) * 27)
    triples = list(combinations(domain.attrs, 3))
    rest = 1 - ws.ONE_WAY_SHARE - ws.PROBE_SHARE
    rho = Fraction(1, 200)
    zcdp = ws.plan_wide_selection(domain, triples, Budget.zcdp(rho), "gaussian")
    sigma = math.sqrt(len(triples) / (2 * float(rho * rest)))
    assert zcdp.expected_noise_all == pytest.approx(8 * math.sqrt(2 / math.pi) * sigma, rel=1e-12)
    assert zcdp.all_fit.fits and zcdp.all_fit.objective == "l2"  # 2^27-cell tree: least squares
    assert zcdp.all_fraction == ws.ALL_L2_NOISE_FRACTION == Fraction(1, 2)
    assert "1/2 of that deviation (ALL_L2_NOISE_FRACTION" in "\n".join(zcdp.lines())
    pure = ws.plan_wide_selection(domain, triples, Budget.pure(Fraction(1)), "laplace")
    assert pure.expected_noise_all == pytest.approx(8 * len(triples) / float(rest), rel=1e-12)
    # A workload whose "all" is fitted smooth (a chain of pairs: a small junction tree) keeps AIM's criterion.
    chain = [(domain.attrs[i], domain.attrs[i + 1]) for i in range(26)]
    smooth = ws.plan_wide_selection(domain, chain, Budget.zcdp(rho), "gaussian")
    assert smooth.all_fit.objective == "smooth" and smooth.all_fraction == 1
    # Least squares forced ([auto] estimator = "l2") fits selection by least squares too: AIM's criterion.
    forced = ws.plan_wide_selection(domain, triples, Budget.zcdp(rho), "gaussian", fit={"objective": "l2"})
    assert forced.all_fit.objective == "l2" and forced.all_fraction == 1
    # A workload with pairs keeps AIM's criterion though its "all" is fitted by least squares (every
    # pair of 27 attributes: a 2^27-cell tree), and so does a mixed one (the triples alone took the half, above).
    pairs = list(combinations(domain.attrs, 2))
    for sets, fraction in ((pairs, 1), (triples + pairs[:1], 1)):
        p = ws.plan_wide_selection(domain, sets, Budget.zcdp(rho), "gaussian")
        assert p.all_fit.objective == "l2" and p.all_fraction == fraction, (len(sets), p.all_fit.reason)
    assert smooth.expected_noise_all == pytest.approx(
        4 * math.sqrt(2 / math.pi) * math.sqrt(26 / (2 * float(rho * rest))), rel=1e-12)
    e = zcdp.expected_noise_all
    half, one = zcdp.all_fraction, smooth.all_fraction
    assert ws.measures_all(e, 2 * e, half) and not ws.measures_all(e, 2 * e * (1 - 1e-9), half)
    assert ws.measures_all(e, e, one) and not ws.measures_all(e, e * (1 - 1e-9), one)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_all_fitted_by_least_squares_needs_half_the_deviation_and_the_ledger_stays_exact(wide, monkeypatch):
    """A run whose probe lies between E_all and 2 E_all: AIM's criterion alone (fraction 1) measured
    every pair; with the fraction 1/2 (ALL_L2_NOISE_FRACTION, given explicitly: the rule keeps 1 for
    pairs) it selects. Same draws up to the decision, the ledger sums exactly to the budget both
    ways, and the release says why."""
    from fractions import Fraction
    from itertools import combinations

    from dpopt.privacy.budget import Budget
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy import wide_selection as ws

    net, data = wide
    pairs = list(combinations(data.domain.attrs, 2))
    budget = Budget.zcdp(Fraction(1, 20))
    runs = {}
    assert ws.plan_wide_selection(data.domain, pairs, budget, "gaussian").all_fraction == 1  # pairs: AIM's
    for fraction in (Fraction(1), ws.ALL_L2_NOISE_FRACTION):
        p = ws.plan_wide_selection(data.domain, pairs, budget, "gaussian", all_fraction=fraction)
        assert p.all_fit.objective == "l2" and p.all_fraction == fraction
        accountant = budget.accountant()
        runs[fraction] = ws.run_wide_selection(p, data, accountant, make_random(2))
        assert accountant.spent.rho == budget.rho  # exact
    aim, rule = runs[Fraction(1)], runs[Fraction(1, 2)]
    assert aim.deviation == rule.deviation and aim.expected_noise_all == rule.expected_noise_all
    assert rule.deviation / 2 < rule.expected_noise_all <= rule.deviation  # the case the rule changes
    assert aim.mode == "all" and rule.mode == "select" and len(rule.chosen) >= 1
    assert "above 1/2 of the one-way model's noisy mean deviation" in rule.describe()
    assert rule.info()["all_fraction"] == "1/2"
