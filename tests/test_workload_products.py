"""Workloads a statistician writes, in specs: products of per-attribute workloads (ranges x
ranges, ranges x identity, prefix x marginals, ...) for the matrix mechanism and MWEM; their
one-line errors; the plan's strategy search, memory estimate and standard-error step; the
expected error against simulation; the shipped 2-D range spec end to end."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms.matrix_mechanism import MatrixMechanism
from dpopt.errors import SpecError
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.queries import AllRanges, Identity, Kronecker, Prefix, Stack, Total
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import make_random
from dpopt.release import plan, run
from dpopt.release.outputs import read_released
from dpopt.spec import load_spec, parse_spec_text
from dpopt.spec.queries import Product, WorkloadSpec
from dpopt.strategy import per_query_variance

from .conftest import shared_data

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "algorithm": "matrix_mechanism",
    "domain": {"attributes": {"age": 12, "hours": 8, "sex": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def mm(**params) -> dict:
    raw = copy.deepcopy(BASE)
    raw["matrix_mechanism"] = params
    return raw


def mwem(**params) -> dict:
    raw = copy.deepcopy(BASE)
    raw["algorithm"] = "mwem"
    raw["mwem"] = {"rounds": 5, **params}
    raw["constraints"] = {"nonnegative": True, "integer": True}
    return raw


def spec_error(raw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return str(info.value)


def frame(n=3000, seed=3) -> pd.DataFrame:
    gen = np.random.default_rng(seed)  # test input, not privacy noise
    return pd.DataFrame({"age": gen.integers(0, 12, n), "hours": gen.integers(0, 8, n), "sex": gen.integers(0, 2, n)})


# ---- the vocabulary -------------------------------------------------------------------------------
def test_products_in_specs_build_the_kronecker_workloads():
    dom = Domain(("age", "hours", "sex"), (12, 8, 2))
    boxes = load_spec(mm(workload="all_ranges", attrs=["age", "hours"])).algorithm.params.workload
    assert boxes == WorkloadSpec("all_ranges", attrs=("age", "hours"))
    W = boxes.build(dom)
    expected = Kronecker([AllRanges(dom.project(["age"]), "age"), AllRanges(dom.project(["hours"]), "hours"),
                          Total(dom.project(["sex"]))], dom)
    np.testing.assert_array_equal(W.to_dense(), expected.to_dense())
    assert W.num_rows == 78 * 36
    assert W.row_labels()[1] == "range age in [0, 0] & range hours in [0, 1]"

    same = load_spec(mm(workload="product", product={"hours": "all_ranges", "age": "all_ranges"})).algorithm
    np.testing.assert_array_equal(same.params.workload.build(dom).to_dense(), W.to_dense())

    cdf = load_spec(mm(workload="prefix", attrs=["age", "hours"])).algorithm.params.workload.build(dom)
    assert cdf.num_rows == 12 * 8 and cdf.to_dense().sum() == pytest.approx(
        sum((a + 1) * (h + 1) * 2 for a in range(12) for h in range(8)))

    # ranges x identity, and prefix x every 1-way marginal of the others (a stack of products)
    rx = load_spec(mm(workload="product", product={"age": "all_ranges", "sex": "identity"})).algorithm
    q = rx.params.workload.build(dom)
    assert q.num_rows == 78 * 2 and q.row_labels()[0] == "range age in [0, 0] & sex=0"
    crossed = load_spec(mm(workload="product", product={"age": "prefix"}, k=1)).algorithm.params.workload
    assert crossed.products == (Product({"age": "prefix"}),) and crossed.k == (1,)
    stack = crossed.build(dom)
    assert isinstance(stack, Stack) and [p.num_rows for p in stack.parts] == [12 * 8, 12 * 2]
    listed = load_spec(mm(workload="product", product=[{"age": "prefix", "hours": "identity"},
                                                       {"age": "prefix", "sex": "identity"}])).algorithm
    np.testing.assert_array_equal(listed.params.workload.build(dom).to_dense(), stack.to_dense())


@pytest.mark.parametrize("params, key, words", [
    (dict(workload="product"), "matrix_mechanism.product", "missing required key"),
    (dict(workload="product", product={"age": "ranges"}), "matrix_mechanism.product.age", "unknown workload 'ranges'"),
    (dict(workload="product", product=[{"age": "prefix"}, {}]), "matrix_mechanism.product[2]", "non-empty table"),
    (dict(workload="product", product="age"), "matrix_mechanism.product", "must be a table"),
    (dict(workload="product", product={"age": "prefix"}, attrs=["age"]), "matrix_mechanism.attrs", "does not apply"),
    (dict(workload="all_ranges", attrs=["age", "age"]), "matrix_mechanism.attrs", "twice"),
    (dict(workload="prefix", attrs=["age"], product={"age": "prefix"}), "matrix_mechanism.product", "does not apply"),
    (dict(workload=2, attrs=["age"]), "matrix_mechanism.attrs", "does not apply to workload = 2"),
    (dict(workload="product", product={"age": "prefix"}, k=0), "matrix_mechanism.k", ">= 1"),
])
def test_bad_products_get_one_line_naming_the_key(params, key, words):
    message = spec_error(mm(**params))
    assert f"key '{key}'" in message and words in message, message
    assert message.count("key '") == 1 and "\n" not in message, message


def test_products_that_do_not_fit_the_domain_name_the_key_once():
    for params, word in ((dict(workload="product", product={"weight": "prefix"}), "weight"),
                         (dict(workload="all_ranges", attrs=["age", "colour"]), "colour"),
                         (dict(workload="product", product={"age": "prefix", "hours": "prefix", "sex": "prefix"},
                               k=1), "too few")):
        with pytest.raises(SpecError) as info:
            plan(mm(**params), require_data=False)
        message = str(info.value)
        assert "matrix_mechanism" in message and word in message and message.count("spec") == 1, message


def test_the_spec_line_prefix_is_printed_once():
    """Issue 28: 'spec X, line 11, key 'matrix_mechanism': spec X, line 12, key ...' printed twice."""
    text = "\n".join(['algorithm = "matrix_mechanism"', "[domain.attributes]", "recency = 7", "frequency = 5",
                      "[data]", 'source = "file"', "[privacy]", 'accounting = "pure"', "epsilon = 1",
                      "[matrix_mechanism]", 'workload = "random_ranges"', 'attrs = ["recency"]', "count = 0"])
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source=Path("rf.toml"))
    assert str(info.value).startswith("spec rf.toml, line 13, key 'matrix_mechanism.count': ")
    assert str(info.value).count("rf.toml") == 1
    text = text.replace("count = 0", "count = 3\nbranching = 1")
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source=Path("rf.toml"))
    assert str(info.value).count("rf.toml") == 1 and "branching" in str(info.value)


# ---- the matrix mechanism ------------------------------------------------------------------------
def test_best_strategy_for_ranges_x_ranges_is_searched_per_attribute():
    W = WorkloadSpec("all_ranges", attrs=("age", "hours"))
    dom = Domain(("age", "hours"), (12, 8))
    p = MatrixMechanism(workload=W).plan(dom, ConstraintSet(dom), Budget.pure(1))
    details = p.details
    optimized = {c.name: c for c in details.candidates}["optimized"]
    assert optimized.details["template"] == "kronecker"
    assert details.bound <= details.expected_error
    # The expected error of the optimised strategy, from dense matrices.
    Wd, Ad = W.build(dom).to_dense(), optimized.query.to_dense()
    brute = np.trace(Wd @ np.linalg.pinv(Ad.T @ Ad) @ Wd.T) * optimized.law.variance
    assert optimized.expected_error == pytest.approx(brute, rel=1e-8)
    assert any("standard errors" in line and "factor by factor" in line for line in p.lines)
    # On a larger grid the per-attribute optimum beats measuring every cell (whose error is the sum
    # of the boxes' volumes, n(n+1)(n+2)/6 per attribute): every box of 30 x 20, Laplace noise.
    dom = Domain(("age", "hours"), (30, 20))
    p = MatrixMechanism(workload=W).plan(dom, ConstraintSet(dom), Budget.pure(1))
    chosen = {c.name: c for c in p.details.candidates}
    identity = chosen["identity"]
    assert identity.trace == pytest.approx(30 * 31 * 32 / 6 * 20 * 21 * 22 / 6)
    assert p.details.chosen == "optimized" and p.details.expected_error < 0.99 * identity.expected_error


def test_the_plan_memory_covers_the_answers_and_the_standard_errors(monkeypatch):
    p = plan(mm(workload="all_ranges", attrs=["age", "hours"]), require_data=False)
    items = {item.what: item for item in p.resources.items}
    m = 78 * 36
    assert items["the workload's answers"].bytes >= 200 * m
    assert "factor by factor" in items["the standard-error step"].engine
    assert items["the standard-error step"].bytes >= 8 * m
    # Constrained: no standard errors, so nothing is counted for them.
    raw = mm(workload="all_ranges", attrs=["age", "hours"])
    raw["constraints"] = {"nonnegative": True}
    assert "the standard-error step" not in {item.what for item in plan(raw, require_data=False).resources.items}
    # The plan refuses a release whose answers would not fit, before any data is read.
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", "500K")
    with pytest.raises(SpecError, match="the workload's answers needs about"):
        plan(mm(workload="all_ranges", attrs=["age", "hours"]), require_data=False)


def test_a_product_release_runs_with_exact_standard_errors(tmp_path):
    raw = mm(workload="product", product={"age": "all_ranges", "sex": "identity"})
    planned = plan(raw, data=frame()).algorithm_plan
    details, law = planned.details, planned.steps[0].law
    release = run(raw, data=frame(), out=tmp_path / "out", seed=2)
    answers = read_released(tmp_path / "out" / "marginals" / "workload.csv")
    assert release.success and len(answers) == 78 * 2
    W, A = details.workload, details.strategy
    X = W.to_dense() @ np.linalg.pinv(A.to_dense())   # W A⁺: diag(W (AᵀA)⁺ Wᵀ) = row norms² of W A⁺
    explicit = np.einsum("ij,ij->i", X, X)
    # The release forms (AᵀA)⁺ factor by factor from the Gram, whose pseudo-inverse is accurate to about
    # eps·cond(AᵀA) relative (the Gram squares A's condition number). The optimized strategy, and so its
    # condition number, moves with the libraries' releases (on 2026-11-28 cond(A) was 2.8e5: bound 1.7e-5,
    # observed 2.5e-7), so the tolerance is that bound: a fixed 1e-7 broke with a new release
    bound = np.finfo(float).eps * np.linalg.cond(A.to_dense()) ** 2
    assert bound < 1e-3  # the bound is not vacuous
    stderr = np.sqrt(law.variance * explicit)
    np.testing.assert_allclose(answers["stderr"].to_numpy(), stderr, rtol=max(bound, 1e-12))
    # The released answers are the workload applied to the released table.
    np.testing.assert_allclose(answers["count"].to_numpy(), W.matvec(np.asarray(release.counts, dtype=float)))


def test_refused_standard_errors_are_a_note_not_a_crash(tmp_path, monkeypatch):
    from dpopt.strategy import error as error_module

    monkeypatch.setattr(error_module, "MAX_VARIANCE_FLOPS", 1.0)
    raw = mm(workload="all_ranges", attrs=["age", "hours"])
    p = plan(raw, data=frame())
    assert any(line.startswith("  no standard errors:") for line in p.algorithm_plan.lines)
    release = run(raw, data=frame(), out=tmp_path / "out", seed=2)
    assert release.success and any(n.startswith("no standard errors:") for n in release.notes)
    assert "stderr" not in read_released(tmp_path / "out" / "marginals" / "workload.csv").columns


@pytest.mark.slow
def test_expected_error_of_a_product_agrees_with_simulation():
    """Li et al. (PODS 2010, Prop. 4): E‖W x^ - W x‖² = v trace(W (AᵀA)⁺ Wᵀ). Total and per-query
    squared errors of 250 independent measurements (seeded discrete Laplace) against the plan's
    expected error and the per-query variances, within 4.5 standard errors of the mean."""
    dom = Domain(("age", "hours"), (12, 8))
    W_spec = WorkloadSpec("product", products=(Product({"age": "all_ranges", "hours": "prefix"}),))
    alg = MatrixMechanism(workload=W_spec)
    p = alg.plan(dom, ConstraintSet(dom), Budget.pure("1/2"))
    W = p.details.workload
    gen = np.random.default_rng(5)  # test input
    data = Dataset(np.stack([gen.integers(0, 12, 800), gen.integers(0, 8, 800)], axis=1), dom)
    truth = W.matvec(data.histogram().astype(float))
    runs = 250
    squared = np.empty((runs, W.num_rows))
    for r in range(runs):
        release = alg.run(p, data, p.budget.accountant(), make_random(1000 + r))
        squared[r] = (release.answers["workload"]["count"].to_numpy() - truth) ** 2
    totals = squared.sum(axis=1)
    se = totals.std(ddof=1) / np.sqrt(runs)
    assert abs(totals.mean() - p.details.expected_error) < 4.5 * se, (totals.mean(), p.details.expected_error, se)
    variances = p.steps[0].law.variance * per_query_variance(W, p.details.strategy)
    z = (squared.mean(axis=0) - variances) / (squared.std(axis=0, ddof=1) / np.sqrt(runs))
    assert np.abs(z).max() < 5.0


# ---- MWEM ------------------------------------------------------------------------------------------
def test_mwem_specs_take_ranges_and_products(tmp_path):
    p = load_spec(mwem(workload="all_ranges", attrs=["age", "hours"])).algorithm.params
    assert p.workload == WorkloadSpec("all_ranges", attrs=("age", "hours"))
    raw = mwem(workload="product", product=[{"age": "all_ranges", "hours": "all_ranges"},
                                            {"age": "prefix", "sex": "identity"}])
    described = plan(raw, data=frame()).describe()
    assert "all_ranges(age) x all_ranges(hours) + prefix(age) x identity(sex), 2,832 queries" in described
    release = run(raw, data=frame(), out=tmp_path / "out", seed=4)
    assert release.success and release.counts.sum() == 3000
    assert set(release.answers) == {"age, hours", "age, sex"}
    blocks = {s["block"] for s in release.info["selected"]}
    assert blocks <= {"Kronecker(age ⊗ hours ⊗ sex)"}
    random_boxes = load_spec(mwem(workload="random_ranges", attrs=["age", "hours"], count=40, workload_seed=2))
    assert random_boxes.algorithm.params.workload.count == 40


@pytest.mark.parametrize("params, key, words", [
    (dict(workload="all_ranges", attrs=["age"], marginals=1), "mwem.workload", "not both"),
    (dict(workload="all_marginals", k=1), "mwem.workload", "choose one of"),
    (dict(workload=2), "mwem.workload", "must be one of"),
    (dict(workload="product", product={"age": "prefix"}, select="block"), "mwem.select", "applies to marginals"),
    (dict(workload="product", product={"age": "prefix"}, count=3), "mwem.count", "does not apply"),
])
def test_bad_mwem_workloads_name_the_key(params, key, words):
    message = spec_error(mwem(**params))
    assert f"key '{key}'" in message and words in message and message.count("key '") == 1, message


# ---- the shipped spec ------------------------------------------------------------------------------
def test_the_shipped_2d_range_spec_runs_end_to_end(tmp_path):
    """models/adult_ranges_2d.toml: every box of Adult's age x years of education (377,400 counts),
    with exact standard errors computed factor by factor."""
    path = REPO / "models" / "adult_ranges_2d.toml"
    spec = load_spec(path)
    assert spec.algorithm.params.workload == WorkloadSpec("all_ranges", attrs=("age", "education-num"))
    data = shared_data("adult.csv")
    release = run(path, data=data, out=tmp_path / "out", seed=0)
    answers = read_released(tmp_path / "out" / "marginals" / "workload.parquet")
    assert release.success and len(answers) == 2775 * 136
    assert (answers["stderr"] > 0).all() and np.isfinite(answers["stderr"]).all()
    details = release.info
    assert details["strategy"] == "optimized"
    # The expected total squared error is the sum of the squared standard errors.
    assert float((answers["stderr"] ** 2).sum()) == pytest.approx(details["expected_total_squared_error"], rel=1e-9)
