"""Release specs with ``algorithm = "matrix_mechanism"``: the ``[matrix_mechanism]`` table, its errors
(file, line and key), ``dpopt check``'s plan (every strategy's expected error and the SVD bound,
before any data is read) and a run through the release pipeline."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms.matrix_mechanism import WorkloadSpec
from dpopt.errors import SpecError
from dpopt.release import plan, run
from dpopt.release.outputs import read_released
from dpopt.spec import load_spec, parse_spec_text

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "algorithm": "matrix_mechanism",
    "domain": {"attributes": {"age": 30, "sex": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def mm(reconstruct=None, constraints=None, **params) -> dict:
    raw = copy.deepcopy(BASE)
    raw["matrix_mechanism"] = {"workload": "prefix", "attrs": ["age"], **params}
    if reconstruct is not None:
        raw["reconstruct"] = reconstruct
    if constraints is not None:
        raw["constraints"] = constraints
    return raw


def spec_error(raw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return str(info.value)


def test_defaults_and_values():
    p = load_spec(mm()).algorithm.params
    assert p.workload == WorkloadSpec("prefix", attrs=("age",))
    assert (p.strategy, p.template, p.branching, p.objective, p.mechanism) == ("best", "auto", 2, "l2", None)
    assert "optimized" in p.candidates
    raw = mm(workload=2, optimize=True, p=8, bound_delta="1/1000", reconstruct={"objective": "l1"})
    del raw["matrix_mechanism"]["attrs"]  # an order k takes no attribute list
    p = load_spec(raw).algorithm.params
    assert p.workload == WorkloadSpec("all_marginals", k=(2,)) and p.strategy == "optimized" and p.p == 8
    assert p.bound_delta == Fraction(1, 1000) and p.objective == "l1"
    p = load_spec({**mm(), "matrix_mechanism": {"workload": [["age"], ["age", "sex"]]}}).algorithm.params
    assert p.workload.sets == (("age",), ("age", "sex"))
    p = load_spec({**mm(), "matrix_mechanism": {"workload": "all_marginals", "k": [1, 2]}}).algorithm.params
    assert p.workload.k == (1, 2)
    p = load_spec(mm(optimize=False)).algorithm.params
    assert "optimized" not in p.candidates
    p = load_spec(mm(workload="random_ranges", attrs=["age", "sex"], count=50, workload_seed=3)).algorithm.params
    assert p.workload.count == 50 and p.workload.seed == 3


@pytest.mark.parametrize("params, key, words", [
    (dict(strategy="magic"), "matrix_mechanism.strategy", "choose one of"),
    (dict(strategy="identity", optimize=True), "matrix_mechanism.optimize", "keep one of the two"),
    (dict(candidates=["identity", "best"]), "matrix_mechanism.candidates[2]", "unknown value"),
    (dict(template="ga"), "matrix_mechanism.template", "choose one of"),
    (dict(p=0), "matrix_mechanism.p", ">= 1"),
    (dict(branching=1), "matrix_mechanism.branching", ">= 2"),
    (dict(mechanism="cauchy"), "matrix_mechanism.mechanism", "choose one of"),
    (dict(bound_delta=2), "matrix_mechanism.bound_delta", "in (0, 1)"),
    (dict(workload="cubes"), "matrix_mechanism.workload", "choose one of"),
    (dict(workload=0), "matrix_mechanism.workload", ">= 1"),
    (dict(workload="random_ranges"), "matrix_mechanism.count", "count"),
    (dict(workload="all_marginals", attrs=None), "matrix_mechanism.k", "needs k"),
    (dict(colour="red"), "matrix_mechanism.colour", "unknown key"),
])
def test_bad_keys_name_the_key(params, key, words):
    raw = mm(**params)
    raw["matrix_mechanism"] = {k: v for k, v in raw["matrix_mechanism"].items() if v is not None}
    message = spec_error(raw)
    assert f"key '{key}'" in message and words in message, message


def test_reconstruct_keys_and_the_line_of_the_key():
    assert "key 'reconstruct.objective'" in spec_error(mm(reconstruct={"objective": "entropy"}))
    text = "\n".join(['algorithm = "matrix_mechanism"', "[domain.attributes]", "a = 5", "[data]",
                      'source = "file"', "[privacy]", 'accounting = "pure"', "epsilon = 1", "[matrix_mechanism]",
                      'workload = "prefix"', 'attrs = ["a"]', 'template = "genetic"'])
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source=Path("x.toml"))
    assert "spec x.toml, line 12, key 'matrix_mechanism.template'" in str(info.value)


def test_check_prints_every_strategy_and_the_bound_without_reading_data(tmp_path):
    missing = tmp_path / "never-read.csv"
    missing.write_text("age,sex\n")  # plan() must not read it
    with pytest.raises(SpecError) as info:
        plan(mm(attrs=["height"]), data=missing)
    assert "matrix_mechanism" in str(info.value) and "height" in str(info.value)
    p = plan(mm(bound_delta="1/500"), data=missing)
    text = p.describe()
    for word in ("identity", "hierarchical", "wavelet", "optimized", "SVD lower bound", "P(eps, delta)"):
        assert word in text, word
    details = p.algorithm_plan.details
    assert details.bound <= details.expected_error
    assert sum((s.share for s in p.algorithm_plan.steps), Fraction(0)) == 1


def test_the_model_spec_loads(tmp_path):
    s = load_spec(REPO / "models" / "adult_matrix_mechanism.toml")
    params = s.algorithm.params
    assert s.algorithm.name == "matrix_mechanism" and params.workload.kind == "random_ranges"
    assert params.workload.count == 1000 and params.bound_delta == Fraction(1, 48842)
    assert s.constraints.nonnegative and s.constraints.integer


def test_a_spec_runs_end_to_end(tmp_path):
    gen = np.random.default_rng(3)  # test input, not privacy noise
    frame = pd.DataFrame({"age": gen.integers(1, 30, 500), "sex": gen.integers(0, 2, 500)})
    cons = {"nonnegative": True, "integer": True,
            "structural_zeros": [{"where": "age == 0", "name": "nobody at 0"}]}
    release = run(mm(constraints=cons), data=frame, out=tmp_path / "out", seed=1)
    assert release.success and release.counts.dtype.kind in "iu"
    assert (release.counts >= 0).all() and release.counts.reshape(30, 2)[0].sum() == 0
    answers = read_released(tmp_path / "out" / "marginals" / "workload.csv")
    assert len(answers) == 30 and list(answers.columns)[:2] == ["query", "count"]
    free = run(mm(), data=frame, out=tmp_path / "free", seed=1)
    assert "stderr" in free.answers["workload"].columns
