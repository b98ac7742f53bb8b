"""``algorithm = "dualquery"`` in a release spec: parsing, key errors, and an end-to-end run."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import SpecError
from dpopt.release import plan, run
from dpopt.spec import load_spec

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "algorithm": "dualquery",
    "domain": {"attributes": {"a": 3, "b": 2, "c": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "approx", "epsilon": 1, "delta": 1e-5},
    "dualquery": {"order": 2, "rounds": 4},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def spec(**dualquery) -> dict:
    raw = copy.deepcopy(BASE)
    raw["dualquery"].update(dualquery)
    return raw


def spec_error(raw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return str(info.value)


def test_the_section_parses_with_defaults():
    params = load_spec(spec()).algorithm.params
    assert (params.workload, params.order, params.rounds, params.samples, params.eta) == ("marginals", 2, 4, None,
                                                                                          Fraction(1))
    assert (params.solver, params.time_limit, params.project) == ("highs", 30.0, False)
    raw = spec()
    raw["dualquery"] = {"samples": 300, "eta": 0.4, "workload": "random", "queries": 50, "attributes": ["a", "c"]}
    params = load_spec(raw).algorithm.params
    assert params.rounds is None and params.samples == 300 and params.eta == Fraction(2, 5)
    assert params.attributes == ("a", "c") and params.queries == 50


@pytest.mark.parametrize("keys, key, words", [
    ({"rounds": 1}, "'dualquery.rounds'", ">= 2"),
    ({"samples": 0}, "'dualquery.samples'", ">= 1"),
    ({"solver": "gurobi"}, "'dualquery.solver'", "unknown value 'gurobi'"),
    ({"workload": "all"}, "'dualquery.workload'", "unknown value 'all'"),
    ({"eta": -1}, "'dualquery.eta'", "> 0"),
    ({"time_limit": 0}, "'dualquery.time_limit'", "> 0"),
    ({"project": "yes"}, "'dualquery.project'", "true or false"),
    ({"rate": 1}, "'dualquery.rate'", "unknown key"),
])
def test_bad_keys_are_named(keys, key, words):
    message = spec_error(spec(**keys))
    assert f"key {key}" in message and words in message


def test_accounting_other_than_approx_is_refused_with_the_reason():
    raw = spec()
    raw["privacy"] = {"accounting": "pure", "epsilon": 1}
    message = spec_error(raw)
    assert "advanced composition" in message


def test_the_kdd99_model_loads():
    s = load_spec(REPO / "models" / "kdd99_dualquery.toml")
    p = s.algorithm.params
    assert (s.algorithm.name, p.workload, p.order, p.queries, p.samples, p.eta) == (
        "dualquery", "random", 3, 500_000, 1750, Fraction(6, 5))
    assert len(s.domain.attributes) == 42 and sum(s.domain.attributes.values()) == 419


def test_an_end_to_end_run_releases_records_and_a_table(tmp_path):
    gen = np.random.default_rng(1)  # test data, not privacy noise
    frame = pd.DataFrame({"a": gen.integers(0, 3, 400), "b": gen.integers(0, 2, 400), "c": gen.integers(0, 2, 400)})
    frame = frame[~((frame.a == 2) & (frame.b == 1))]
    path = tmp_path / "people.csv"
    frame.to_csv(path, index=False)
    raw = spec()
    raw["constraints"] = {"nonnegative": True, "integer": True,
                          "structural_zeros": [{"where": "a == 2 and b == 1", "name": "no a2 b1"}]}
    p = plan(raw, data=path, seed=3)
    assert "algorithm: dualquery" in p.describe()
    release = run(raw, data=path, seed=3, out=tmp_path / "out")
    assert release.success and release.status.name == "COMPLETED"
    assert len(release.records) == 4 and release.counts.sum() == len(frame)
    assert not ((release.records["a"] == 2) & (release.records["b"] == 1)).any()
    assert release.ledger["epsilon"].sum() == 1
    written = {p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert any(name.startswith("synthetic") for name in written), written
