"""Adding an algorithm is one module: a toy one registered here runs through spec, plan, CLI-style run
and report without any edit to ``dpopt/spec`` or ``dpopt/release``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dpopt.algorithms import (
    REGISTRY,
    Algorithm,
    AlgorithmParams,
    PlannedMeasure,
    get_algorithm,
    register,
)
from dpopt.algorithms.base import (
    make_release,
    measured_answers,
    round_release,
    unregister,
)
from dpopt.errors import ParameterError, SpecError
from dpopt.estimate.status import Status
from dpopt.model.queries.basic import Identity
from dpopt.privacy.mechanisms import calibrate, measure


@dataclass(frozen=True)
class IdentityParams(AlgorithmParams):
    repeat: int = 1

    def validate(self) -> None:
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise ParameterError(f"repeat must be an integer >= 1, got {self.repeat!r}")

    @classmethod
    def from_spec(cls, reader):
        t = reader.table("identity_histogram")
        return cls(repeat=t.int("repeat", default=1, minimum=1))


class IdentityHistogram(Algorithm):
    """The baseline: the noisy histogram itself, averaged over ``repeat`` equal measurements."""

    name = "identity_histogram"
    title = "noisy histogram"
    reference = "Dwork, McSherry, Nissim, Smith 2006"
    supports = frozenset({"integer"})
    sections = {"identity_histogram": ("repeat",)}
    Params = IdentityParams

    def plan(self, domain, constraints, budget):
        query = Identity(domain)
        costs = budget.shares({f"histogram {i + 1}": 1 for i in range(self.params.repeat)})
        steps = [PlannedMeasure(label, query, budget.noise(), Fraction(1, self.params.repeat), cost,
                                calibrate(query, cost)) for label, cost in costs.items()]
        return self.new_plan(domain, constraints, budget, steps=steps)

    def run(self, plan, data, accountant, rng):
        ms = [measure(s.query, data, s.law, accountant, rng, label=s.label) for s in plan.steps]
        x = np.mean([m.values for m in ms], axis=0)
        counts, rounding, failure = round_release(x, plan.constraints, ms)
        return make_release(self, plan, accountant, status=Status.COMPLETED, message="averaged", counts=counts,
                            answers=measured_answers(ms, counts), measurements=ms, rounding=rounding)


@pytest.fixture
def toy():
    register(IdentityHistogram)
    yield IdentityHistogram
    unregister("identity_histogram")


SPEC = {
    "algorithm": "identity_histogram",
    "domain": {"attributes": {"a": ["x", "y"], "b": 3}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "identity_histogram": {"repeat": 2},
}


def test_a_toy_algorithm_runs_through_the_whole_pipeline_unchanged(toy, tmp_path):
    from dpopt.release import plan, run

    frame = pd.DataFrame({"a": ["x", "y", "y", "x"] * 25, "b": [0, 1, 2, 2] * 25})
    p = plan(SPEC, data=frame)
    assert "identity_histogram (repeat = 2)" in p.describe() and "histogram 2" in p.describe()
    r = run(SPEC, data=frame, seed=4, out=tmp_path / "out")
    assert r.algorithm == "identity_histogram" and r.status is Status.COMPLETED
    assert sum(r.ledger["epsilon"], Fraction(0)) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["algorithm"]["name"] == "identity_histogram" and report["privacy"]["ledger_sums_to_budget"]
    assert (tmp_path / "out" / "release.csv").is_file()


def test_its_own_spec_keys_are_checked_with_the_line_and_key(toy):
    from dpopt.spec import load_spec

    with pytest.raises(SpecError, match=r"key 'identity_histogram.repeat'.*>= 1"):
        load_spec({**SPEC, "identity_histogram": {"repeat": 0}})
    with pytest.raises(SpecError, match=r"key 'identity_histogram.repet'.*did you mean 'repeat'"):
        load_spec({**SPEC, "identity_histogram": {"repet": 2}})
    with pytest.raises(SpecError, match="cannot impose structural zeros"):
        load_spec({**SPEC, "constraints": {"structural_zeros": [{"where": "a == 'x'"}]}})


def test_unknown_names_list_the_registered_algorithms():
    with pytest.raises(ParameterError) as info:
        get_algorithm("nonesuch")
    assert f"registered: {', '.join(sorted(REGISTRY))}" in str(info.value)
    assert {"barak", "measure_reconstruct", "mwem", "mwem_factored"} <= set(REGISTRY)
    with pytest.raises(ParameterError, match="already taken"):
        @register
        class Clash(IdentityHistogram):
            name = "barak"


def test_unregistered_algorithms_are_not_in_the_spec_vocabulary():
    from dpopt.spec import load_spec

    assert "identity_histogram" not in REGISTRY
    with pytest.raises(SpecError, match="key 'identity_histogram': unknown key"):
        load_spec(SPEC)
    bare = {k: v for k, v in SPEC.items() if k != "identity_histogram"}
    with pytest.raises(SpecError, match="unknown value 'identity_histogram'"):
        load_spec(bare)
