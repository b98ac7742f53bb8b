"""The marginal-space estimate's objective (issue 27): ``objective="auto"`` takes the smooth
estimate when nothing it cannot keep is declared and its junction tree is small, least squares
otherwise; the choice, its reason and the tree's size reach the release, report.json and the
notes; the spec keys ``[marginal_space] objective`` and ``[auto] estimator`` (wide path) choose it,
and bad values are one-line errors naming the key.

References: the rule's decision on constructed cases each way (tree sizes by hand), and the
``"auto"`` estimate equal to the explicitly asked objective's on the same measurements.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.errors import DomainError, ParameterError, SpecError
from dpopt.estimate.marginal_space import estimate_marginals
from dpopt.estimate.marginal_space.estimator import SMOOTH_TREE_CELLS, choose_objective
from dpopt.estimate.marginal_space.graphical.smooth import tree_cells
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total
from dpopt.release import plan, run


def _measure(data, sets, sigma, seed):
    gen = np.random.default_rng(seed)  # test noise, not privacy noise
    out = []
    for t in sets:
        q = Marginal(data.domain, list(t))
        y = np.asarray(data.marginal(list(t)), float) + gen.normal(0.0, sigma, q.num_rows)
        out.append(Measurement(q, y, "gaussian", sigma, sigma**2, label=", ".join(t)))
    return out


@pytest.fixture(scope="module")
def chain():
    """12 binary attributes (4,096 cells), a chain of triples: a tree of 10 cliques of 8 cells."""
    data = random_sparse_network(12, seed=3).sample(3000, 4)
    names = data.domain.attrs
    sets = [tuple(names[i:i + 3]) for i in range(10)]
    return data, sets, _measure(data, sets, 6.0, 1)


def test_tree_size_by_hand(chain):
    data, sets, _ = chain
    axes = [tuple(data.domain.axes(s)) for s in sets]
    cells, largest, reads = tree_cells(data.domain.sizes, axes, [])
    assert cells == 10 * 8 and len(largest) == 3 and reads == 80 + 80  # each triple read from its own clique
    # all pairs: one clique of 2^12 cells, read once per pair; a limit stops the count early
    pairs = list(combinations(range(12), 2))
    assert tree_cells(data.domain.sizes, pairs, [])[::2] == (4096, 4096 + 66 * 4096)
    stopped = tree_cells(data.domain.sizes, pairs, [], 1000)
    assert stopped[0] > 1000 and stopped[2] is None


def test_rule_small_tree_takes_smooth_and_equals_it(chain):
    data, sets, ms = chain
    est = estimate_marginals(ms, exact_cells=0)
    chosen = est.info["objective"]
    assert chosen["asked"] == "auto" and chosen["objective"] == "smooth" and chosen["tree_cells"] == 80
    assert "junction tree of the measured sets holds 80 cells" in chosen["reason"]
    assert est.message.endswith(chosen["reason"]) and est.objective == "smooth"
    asked = estimate_marginals(ms, objective="smooth", exact_cells=0)
    for s in sets:
        np.testing.assert_array_equal(est.marginal(s), asked.marginal(s))
    # the table route (4,096 cells <= exact_cells): least squares stays the default there
    table = estimate_marginals(ms)
    assert table.info["objective"]["objective"] == "l2" and table.info["objective"]["table"]
    assert "fit a table" in table.info["objective"]["reason"]
    asked_table = estimate_marginals(ms, objective="smooth")
    assert asked_table.info["objective"]["objective"] == "smooth" and asked_table.info["objective"]["table"]


def test_rule_big_tree_takes_least_squares():
    # all 231 pairs of 22 binary attributes: one clique of 2^22 cells (at the limit), read once per pair
    data = random_sparse_network(22, seed=2).sample(500, 4)
    pairs = list(combinations(data.domain.attrs, 2))
    chosen = choose_objective(data.domain, pairs)
    assert chosen.objective == "l2" and chosen.tree_cells == 2**22
    assert f"holds 4,194,304 cells, but each Newton product would read {232 * 2**22:,}" in chosen.reason
    # 12 attributes: the tree (4,096 cells) is above a smaller limit, or its reads are
    small = data.domain.project(data.domain.attrs[:12])
    twelve = list(combinations(small.attrs, 2))
    assert choose_objective(small, twelve, exact_cells=0).objective == "smooth"
    tree = choose_objective(small, twelve, exact_cells=0, limit=4000)
    assert tree.objective == "l2" and "more than 4,000 cells" in tree.reason and "4,096 cells" in tree.reason
    reads = choose_objective(small, twelve, exact_cells=0, limit=100_000)
    assert reads.objective == "l2" and "read 274,432" in reads.reason and reads.tree_cells == 4096


def test_rule_keeps_least_squares_for_what_smooth_cannot_keep(chain):
    data, sets, ms = chain
    dom = data.domain
    inv = ConstraintSet(dom, [NonNegativity(), Invariant(Total(dom), np.array([3000.0]), name="n")])
    zeros = ConstraintSet(dom, [NonNegativity(), StructuralZeros(f"{sets[0][0]} == 0 and {sets[0][1]} == 0")])
    exact = Measurement.exact(Marginal(dom, list(sets[0])), data.marginal(list(sets[0])).astype(float), "census")
    cases = [({"constraints": inv}, "invariants"), ({"constraints": zeros}, "structural zeros"),
             ({"total": 3000.0}, "public total"), ({"shrink": True}, "shrink"),
             ({"nonnegative": False}, "nonnegative = false")]
    for options, says in cases:
        est = estimate_marginals(ms, exact_cells=0, **options)
        assert est.info["objective"]["objective"] == "l2" and says in est.info["objective"]["reason"], options
        assert est.objective == "l2"  # (the choice is under test here, not the solve)
    asked = estimate_marginals(ms, exact_cells=0, constraints=inv, objective="l2")  # the same estimate
    auto = estimate_marginals(ms, exact_cells=0, constraints=inv)
    for s in sets:
        np.testing.assert_array_equal(auto.marginal(s), asked.marginal(s))
    est = estimate_marginals(ms + [exact], exact_cells=0)
    assert est.info["objective"]["objective"] == "l2" and "'census' is exact" in est.info["objective"]["reason"]
    assert SMOOTH_TREE_CELLS == 2**22


def test_asked_smooth_that_cannot_run_names_the_clique(chain):
    data, _, _ = chain
    pairs = list(combinations(data.domain.attrs, 2))
    ms = _measure(data, pairs, 6.0, 3)
    with pytest.raises(DomainError, match=r"largest clique: .* with 4,096 cells") as err:
        estimate_marginals(ms, objective="smooth", exact_cells=0, max_cells=1000)
    assert "\n" not in str(err.value)
    with pytest.raises(ParameterError, match="objective must be one of 'auto', 'l2', 'smooth'"):
        estimate_marginals(ms, objective="ls")


# ---- the spec faces ---------------------------------------------------------------------------------

D = 30
DpoptErrors = (DomainError, SpecError)


@pytest.fixture(scope="module")
def wide():
    net = random_sparse_network(D, seed=4)
    return net, net.sample(4000, 5)


def space_spec(net, sets, **marginal_space):
    return {"name": "objective-face", "algorithm": "marginal_space",
            "domain": {"attributes": {a: 2 for a in net.domain.attrs}}, "data": {"source": "file"},
            "privacy": {"accounting": "zcdp", "rho": 0.5},
            "measure": [{"query": "marginal", "attrs": list(s), "mechanism": "gaussian",
                         "share": str(Fraction(1, len(sets)))} for s in sets],
            "marginal_space": {"records": False, **marginal_space}, "output": {"formats": ["csv"], "plots": False}}


@pytest.mark.filterwarnings("ignore::UserWarning")  # a seeded run is not private: a test input
def test_marginal_space_spec_reports_the_choice(wide):
    net, data = wide
    names = net.domain.attrs
    sets = [tuple(names[i:i + 3]) for i in range(0, D - 2, 2)]
    p = plan(space_spec(net, sets), data=data)
    assert "objective ([marginal_space] objective = 'auto'): smooth: the junction tree" in p.describe()
    from dpopt.release.resources import estimate_memory

    item = estimate_memory(p).largest
    tree = 14 * 8 + 2  # 14 triples, each its own clique, and the last attribute alone
    assert item.what == "the smooth marginal-space estimate" and item.bytes == tree * 280
    release = run(space_spec(net, sets), data=data, seed=3)
    assert release.success and release.reconstruction.objective == "smooth"
    chosen = release.reconstruction.info["objective"]
    assert release.info["objective"] == chosen and chosen["tree_cells"] == tree
    assert release.report["algorithm"]["objective"] == chosen
    assert any(n.startswith("Objective ([marginal_space] objective = 'auto'): smooth") for n in release.notes)
    assert release.message.endswith(chosen["reason"])
    least = run(space_spec(net, sets, objective="l2"), data=data, seed=3)
    assert least.success and least.reconstruction.objective == "l2"
    assert least.info["objective"]["reason"] == "least squares: asked for"


@pytest.mark.parametrize("bad, says", [("ls", "unknown value 'ls'"), (1, "must be a string")])
def test_marginal_space_spec_bad_objective_is_one_line_error_naming_the_key(wide, bad, says):
    net, data = wide
    with pytest.raises(SpecError, match="marginal_space.objective") as err:
        plan(space_spec(net, [net.domain.attrs[:2]], objective=bad), data=data)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_marginal_space_spec_asked_smooth_too_large_is_refused_in_the_plan(wide):
    net, data = wide
    names = net.domain.attrs
    sets = [(a, b) for a, b in combinations(names, 2)]  # a clique of all 30 attributes: 2^30 cells
    with pytest.raises(DpoptErrors) as err:
        plan(space_spec(net, sets, objective="smooth"), data=data)
    text = str(err.value)
    assert "marginal_space" in text and "objective" in text and "1,073,741,824 cells" in text and "\n" not in text



def auto_spec(net, **auto):
    return {"name": "wide-pure", "domain": {"attributes": {a: 2 for a in net.domain.attrs}},
            "data": {"source": "file"}, "privacy": {"accounting": "pure", "epsilon": 1},
            "workload": {"marginals": "all 2-way"}, "constraints": {"integer": True},
            "output": {"formats": ["csv"], "synthetic": True}, **({"auto": auto} if auto else {})}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_auto_wide_path_takes_smooth_on_its_selection_and_draws_records(wide):
    """Pure ε on 30 attributes: the selection measures 30 pairs and the one-ways, whose junction
    tree is small, so the default takes the smooth estimate; its integer marginals are records'."""
    net, data = wide
    p = plan(auto_spec(net), data=data)
    assert "how to fit ([auto] estimator = 'auto')" in p.describe()
    release = run(auto_spec(net), data=data, seed=2)
    assert release.success and release.info["wide_selection"]["mode"] == "select"
    chosen = release.info["objective"]
    assert chosen["objective"] == "smooth" and 0 < chosen["tree_cells"] <= SMOOTH_TREE_CELLS
    assert release.reconstruction.objective == "smooth" and release.reconstruction.info["certificate"]["ok"]
    assert any(n.startswith("Objective ([auto] estimator = 'auto'): smooth") for n in release.notes)
    assert abs(len(release.records) - release.reconstruction.total) <= 1  # whole persons, the estimate's total
    n = data.total
    err, fitted_err = [], []
    for attrs in list(combinations(net.domain.attrs, 2))[:60]:
        frame = release.answers[", ".join(attrs)]
        truth = data.marginal(list(attrs))
        assert frame["count"].dtype.kind == "i" and frame["count"].sum() == len(release.records)
        err.append(np.abs(frame["count"].to_numpy() - truth).sum() / n)
        fitted_err.append(np.abs(frame["fitted"].to_numpy() - truth).sum() / n)
    least = run(auto_spec(net, estimator="l2"), data=data, seed=2)
    assert least.info["objective"]["objective"] == "l2" and least.reconstruction.objective == "l2"
    print(f"smooth {np.mean(fitted_err):.4f}, its records {np.mean(err):.4f}")


@pytest.mark.parametrize("auto, says", [({"estimator": "ls"}, "unknown value 'ls'"),
                                        ({"estimator": "smooth", "nonnegative": False}, "nonnegative")])
def test_auto_wide_bad_estimator_is_one_line_error_naming_the_key(wide, auto, says):
    net, data = wide
    with pytest.raises(DpoptErrors + (ParameterError,)) as err:
        plan(auto_spec(net, **auto), data=data)
    text = str(err.value)
    assert "estimator" in text and says in text and "\n" not in text


def test_asked_smooth_with_an_invariant_is_refused_in_the_plan(wide):
    """Refused before any budget is spent, naming the key; 'auto' takes least squares instead."""
    net, data = wide
    sets = [tuple(net.domain.attrs[i:i + 3]) for i in range(0, 6, 2)]
    spec = space_spec(net, sets, objective="smooth")
    spec["constraints"] = {"invariants": [{"query": "total", "values": [4000]}]}
    with pytest.raises(DpoptErrors + (ParameterError,)) as err:
        plan(spec, data=data)
    text = str(err.value)
    assert "objective" in text and "invariants" in text and "\n" not in text
    spec["marginal_space"]["objective"] = "auto"
    assert "objective ([marginal_space] objective = 'auto'): least squares: the constraints declare invariants" \
        in plan(spec, data=data).describe()
