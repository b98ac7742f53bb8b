"""Workload-first specs (issue 25, deliver 1): ``[workload]`` alone runs the ``auto`` plan, an
explicit ``[[measure]]`` spec keeps its algorithm, bad keys name themselves, and the shipped
``models/quickstart_auto.toml`` releases under every constraint with the choice and the
never-worse-than-noisy statement in its notes."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from dpopt.datasets.census import generate_census, state_totals, structural_zero_mask_of_records
from dpopt.errors import SpecError
from dpopt.model.queries import Marginal
from dpopt.release import run
from dpopt.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
QUICKSTART_AUTO = REPO / "models" / "quickstart_auto.toml"

BASE = {
    "domain": {"attributes": {"a": 2, "b": 3, "c": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def spec(**sections) -> dict:
    raw = copy.deepcopy(BASE)
    raw.update(sections)
    return raw


def test_a_workload_first_spec_runs_auto_and_a_measure_spec_keeps_its_default():
    s = load_spec(spec(workload={"marginals": "all 2-way"}))
    assert s.algorithm.name == "auto"
    assert s.algorithm.params.workload.k == 2 and s.algorithm.params.nonnegative
    measured = load_spec(spec(measure=[{"query": "marginal", "attrs": ["a", "b"], "share": 1, "mechanism": "laplace"}]))
    assert measured.algorithm.name != "auto"
    listed = load_spec(spec(workload={"marginals": [["a", "b"], ["c"]], "weights": {"c": 2.0}},
                            auto={"estimator": "l2", "candidates": ["identity", "workload"]}))
    assert listed.algorithm.params.workload.sets == (("a", "b"), ("c",))
    assert listed.algorithm.params.estimator == "l2"


@pytest.mark.parametrize("workload, auto, words", [
    ({"marginals": "all two-way"}, None, "marginals"),
    ({"marginals": [["a", "a"]]}, None, "twice"),
    ({"marginals": "all 2-way", "weights": {"a, b": -1}}, None, "positive"),
    ({"marginals": "all 2-way"}, {"strategy": "fastest"}, "strategy"),
    ({"marginals": "all 2-way"}, {"estimator": "l7"}, "estimator"),
    ({}, None, "workload"),
])
def test_bad_workload_keys_are_one_line_errors_naming_the_key(workload, auto, words):
    sections = {"workload": workload} if auto is None else {"workload": workload, "auto": auto}
    with pytest.raises(SpecError) as info:
        load_spec(spec(**sections))
    message = str(info.value)
    assert words in message and "\n" not in message.strip()


def test_an_unknown_attribute_in_the_workload_is_named_when_the_domain_is_known():
    from dpopt.model.domain import Domain
    from dpopt.spec.workload import WorkloadDeclaration

    with pytest.raises(Exception) as info:
        WorkloadDeclaration(sets=(("a", "zz"),)).build(Domain.from_dict({"a": 2, "b": 3}))
    assert "zz" in str(info.value) and "\n" not in str(info.value).strip()


@pytest.fixture(scope="module")
def quickstart_auto():
    return run(QUICKSTART_AUTO, seed=7)


def test_quickstart_auto_releases_under_every_constraint(quickstart_auto):
    r = quickstart_auto
    assert r.success and r.algorithm == "auto"
    counts = r.counts
    dom = r.plan.domain
    assert counts.dtype == np.int64 and (counts >= 0).all() and counts.sum() == 10_000
    masked = structural_zero_mask_of_records(r.table.drop(columns="count"), dom)
    assert masked.any() and counts[masked].sum() == 0
    truth = state_totals(generate_census(10_000, seed=2024), dom)
    released = r.table.groupby("state", observed=False)["count"].sum()
    assert (released.to_numpy() == truth.to_numpy()).all()
    assert r.constraint_residuals["satisfied"].all()
    assert sum(r.ledger["epsilon"], Fraction(0)) == Fraction(1)


def test_quickstart_auto_keeps_every_workload_table_at_the_floor_or_ceiling_of_its_fit(quickstart_auto):
    r = quickstart_auto
    fitted = np.asarray(r.reconstruction.x, dtype=float)
    for attrs in load_spec(QUICKSTART_AUTO).algorithm.params.workload.sets:
        q = Marginal(r.plan.domain, r.plan.domain.canonical(attrs))
        gap = q.matvec(r.counts.astype(float)) - q.matvec(fitted)
        assert np.all(np.abs(gap) < 1.0 + 1e-6), attrs


def test_quickstart_auto_reports_its_choices_and_the_noisy_answers_promise(quickstart_auto):
    r = quickstart_auto
    info = r.info
    assert info["strategy"] in ("identity", "workload", "residuals", "lower orders")
    assert {row["candidate"] for row in info["candidates"]} >= {"identity", "workload", "residuals"}
    text = "\n".join(r.notes)
    assert "measured: " + info["strategy"] in text
    assert "never worse than the noisy answers" in text
    if info["strategy"] == "workload":  # its tables are measured directly: the promise is checked
        assert "met on all" in text or "NOT MET" in text
