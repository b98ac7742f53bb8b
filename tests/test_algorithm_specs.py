"""Release specs that run the landed algorithms: ``algorithm = "barak"`` and ``algorithm = "mwem"``.

Validation of the new keys (before any data is read, errors naming key and line), the
largest-remainder rounding against brute force, and end-to-end runs of
``models/czech_barak.toml`` and ``models/nltcs_mwem.toml`` on the real data (skipped when
../shared/data is absent).
"""

from __future__ import annotations

import copy
import itertools
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpopt.errors import SpecError
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.queries.marginal import Marginal
from dpopt.release import plan, run
from dpopt.spec import load_spec, parse_spec_text

from .conftest import shared_data

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "domain": {"attributes": {"a": 2, "b": 2, "c": 2}},
    "data": {"source": "file"},
    "privacy": {"accounting": "pure", "epsilon": 1},
    "constraints": {"nonnegative": True, "integer": True},
    "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
}


def spec_with(**sections) -> dict:
    raw = copy.deepcopy(BASE)
    raw.update(sections)
    return raw


def barak(**params) -> dict:
    return spec_with(algorithm="barak", barak={"marginals": 2, **params})


def mwem(**params) -> dict:
    return spec_with(algorithm="mwem", mwem={"marginals": 2, **params})


def spec_error(raw) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return str(info.value)


# ---- validation ----------------------------------------------------------------------------------


def test_valid_specs_parse_with_defaults():
    s = load_spec(barak())
    assert (s.algorithm.name, s.algorithm.params.marginals, s.algorithm.params.method) == ("barak", 2, "linf")
    assert s.measures == () and s.reconstruct.objective == "linf"
    s = load_spec(mwem(marginals=[["a", "b"], ["c"]]))
    assert s.algorithm.params.marginals == (("a", "b"), ("c",))
    assert (s.algorithm.params.rounds, s.algorithm.params.select, s.algorithm.params.repeat_passes) == (10, "query", 0)
    default = spec_with(measure=[{"query": "total", "mechanism": "laplace", "share": 1}])
    assert load_spec(default).algorithm.name == "measure_reconstruct"  # alias: "measure-and-reconstruct"


@pytest.mark.parametrize(
    "raw, key, words",
    [
        (spec_with(algorithm="no_such_algorithm"), "'algorithm'", "unknown value 'no_such_algorithm'"),
        (spec_with(algorithm="barak"), "'barak'", "missing required key"),
        (spec_with(algorithm="mwem", mwem={"rounds": 3}), "'mwem.marginals'", "missing required key"),
        (barak(marginals="a"), "'barak.marginals'", "order k"),
        (barak(marginals=0), "'barak.marginals'", ">= 1"),
        (barak(marginals=True), "'barak.marginals'", "order k"),
        (barak(marginals=[]), "'barak.marginals'", "non-empty list"),
        (barak(marginals=[["a"], []]), "'barak.marginals[2]'", "non-empty list"),
        (barak(marginals=[["a", "a"]]), "'barak.marginals[1]'", "twice"),
        (barak(method="shift"), "'barak.method'", "without a table"),
        (barak(method="l3"), "'barak.method'", "unknown value 'l3'"),
        (barak(t=2), "'barak.t'", "unknown key"),
        (barak(rounds=3), "'barak.rounds'", "unknown key"),
        (mwem(rounds=0), "'mwem.rounds'", ">= 1"),
        (mwem(rounds=2.5), "'mwem.rounds'", "must be an integer"),
        (mwem(select="cuboid"), "'mwem.select'", "unknown value 'cuboid'"),
        (mwem(repeat_passes=-1), "'mwem.repeat_passes'", ">= 0"),
        (mwem(method="linf"), "'mwem.method'", "unknown key"),
    ],
)
def test_bad_algorithm_keys_name_the_key(raw, key, words):
    message = spec_error(raw)
    assert f"key {key}" in message and words in message


def test_sections_must_match_the_algorithm():
    assert "[barak] applies only to algorithm = 'barak'" in spec_error(
        spec_with(barak={"marginals": 1}, measure=[{"query": "total", "mechanism": "laplace", "share": 1}]))
    assert "[mwem] applies only to algorithm = 'mwem'" in spec_error(
        spec_with(algorithm="barak", barak={"marginals": 1}, mwem={"marginals": 1}))
    message = spec_error(dict(barak(), measure=[{"query": "total", "mechanism": "laplace", "share": 1}]))
    assert "key 'measure'" in message and "does not apply to algorithm = 'barak'" in message
    message = spec_error(dict(mwem(), reconstruct={"time_limit": 5}))
    assert "key 'reconstruct.time_limit'" in message and "does not apply to algorithm = 'mwem'" in message
    message = spec_error(dict(barak(), reconstruct={"objective": "l2"}))
    assert "key 'reconstruct.objective'" in message and "[barak] method" in message
    message = spec_error(dict(barak(method="l2"), reconstruct={"backend": "pulp"}))
    assert "key 'reconstruct.backend'" in message and "not a backend for objective 'l2'" in message


def test_mwem_refuses_approx_accounting_and_inequalities():
    raw = mwem()
    raw["privacy"] = {"accounting": "approx", "epsilon": 1, "delta": 1e-6}
    message = spec_error(raw)
    assert "key 'algorithm'" in message and "pure DP" in message and "zCDP" in message
    raw = mwem()
    raw["constraints"] = {"inequalities": [{"query": "total", "upper": 10}]}
    message = spec_error(raw)
    assert "key 'constraints.inequalities'" in message and "cannot impose inequalities" in message


def test_errors_carry_the_line_of_the_key():
    text = "\n".join([
        'algorithm = "mwem"',
        "[domain.attributes]",
        "a = 2",
        "b = 2",
        "[data]",
        'source = "file"',
        "[privacy]",
        'accounting = "pure"',
        "epsilon = 1",
        "[mwem]",
        "marginals = 1",
        'select = "queries"',
    ])
    with pytest.raises(SpecError) as info:
        parse_spec_text(text, source=Path("x.toml"))
    assert "spec x.toml, line 12, key 'mwem.select'" in str(info.value)
    with pytest.raises(SpecError) as info:
        parse_spec_text(text.replace('"mwem"', '"mwme"'), source=Path("x.toml"))
    assert "line 1, key 'algorithm'" in str(info.value) and "did you mean 'mwem'" in str(info.value)


def test_plan_checks_marginals_against_the_domain_before_reading_data(tmp_path):
    missing = tmp_path / "never-read.csv"
    missing.write_text("a,b,c\n")  # plan() must not read it
    for raw, key in ((barak(marginals=[["a", "z"]]), "barak.marginals"),
                     (mwem(marginals=[["a", "z"]]), "mwem.marginals"),
                     (barak(marginals=4), "barak.marginals"),
                     (mwem(marginals=4), "mwem.marginals")):
        with pytest.raises(SpecError) as info:
            plan(raw, data=missing)
        assert f"key '{key}'" in str(info.value)
    p = plan(barak(), data=missing)
    assert p.measures == [] and p.algorithm_plan.details.closure_size == 1 + 3 + 3
    assert "algorithm: barak" in p.describe() and "|B| = 7" in p.describe()
    p = plan(mwem(rounds=4), data=missing)
    assert [q.attrs for q in p.algorithm_plan.details] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert "algorithm: mwem" in p.describe() and "public" in p.describe()


def test_the_model_specs_load():
    s = load_spec(REPO / "models" / "czech_barak.toml")
    assert (s.algorithm.name, s.algorithm.params.marginals, s.algorithm.params.method) == ("barak", 2, "linf")
    s = load_spec(REPO / "models" / "nltcs_mwem.toml")
    assert (s.algorithm.name, s.algorithm.params.rounds, s.algorithm.params.select, s.algorithm.params.repeat_passes) == ("mwem", 30, "query", 20)


# ---- rounding that keeps MWEM's public total ------------------------------------------------------


def test_largest_remainder_is_the_l1_closest_table_with_the_total(rng):
    from dpopt.estimate import round_to_integers
    from dpopt.model.domain import Domain
    from dpopt.model.constraints import Invariant, NonNegativity
    from dpopt.model.queries.basic import Total

    small_domain = Domain.from_dict({"a": 5})

    def keep_total(x, n):  # what MWEM's release does with its public total
        cs = ConstraintSet(small_domain, [NonNegativity(), Invariant(Total(small_domain), np.array([n]))])
        return round_to_integers(x, cs)

    for _ in range(20):
        x = rng.dirichlet(np.ones(5)) * 7.0
        r = keep_total(x, 7.0)
        out = r.x
        assert out.sum() == 7 and np.array_equal(out, np.round(out)) and (out >= 0).all()
        # brute force: every non-negative integer vector of 5 cells summing to 7
        best = min(np.abs(np.array(v) - x).sum() for v in itertools.product(range(8), repeat=5) if sum(v) == 7)
        assert r.fun == pytest.approx(best, abs=1e-12)
    assert not keep_total(np.full(5, 0.3), 1.5).success


# ---- runs on small data (exact ledgers, Gaussian paths, a non-binary domain) -----------------------


def test_barak_zcdp_on_a_non_binary_domain(small_domain, small_frame):
    raw = {
        "algorithm": "barak",
        "domain": {"attributes": {"sex": ["F", "M"], "age": ["0-14", "15-64", "65+"], "region": 4}},
        "data": {"source": "file"},
        "privacy": {"accounting": "zcdp", "epsilon": 1, "delta": 1e-6},
        "barak": {"marginals": [["sex", "age"], ["region"]], "method": "l2"},
        "constraints": {"nonnegative": True, "integer": True},
        "output": {"formats": ["csv"], "summary": ["md"], "plots": True},
    }
    r = run(raw, data=small_frame, seed=3, evaluate=True)
    acc = r.accountant
    assert sum(r.ledger["rho"], Fraction(0)) == acc.total.rho and r.report["privacy"]["ledger_sums_to_budget"]
    assert r.counts.dtype == np.int64 and r.counts.shape == (small_domain.size,) and (r.counts >= 0).all()
    # the parities were measured on the binary encoding; lifted, they are a query of the source cells
    (m,) = r.measurements
    assert m.query.domain == r.plan.domain and m.noise == "discrete_gaussian"
    data = Dataset.from_frame(small_frame, r.plan.domain)
    bdata = r.plan.algorithm_plan.details
    from dpopt.algorithms.barak import binary_data

    assert np.array_equal(m.query.answer(data), bdata.query.answer(binary_data(bdata, data)))
    for label, frame in r.marginals.items():
        attrs = tuple(label.split(", "))
        assert np.array_equal(frame["count"].to_numpy(), Marginal(r.plan.domain, attrs).matvec(r.counts))
    assert any("binary-encoded" in note for note in r.report["algorithm"]["notes"])


def test_mwem_zcdp_block_selection_keeps_the_total(small_frame):
    raw = {
        "algorithm": "mwem",
        "domain": {"attributes": {"sex": ["F", "M"], "age": ["0-14", "15-64", "65+"], "region": 4}},
        "data": {"source": "file"},
        "privacy": {"accounting": "zcdp", "rho": "1/2"},
        "mwem": {"marginals": 2, "rounds": 4, "select": "block", "repeat_passes": 3},
        "constraints": {"integer": True, "invariants": [{"query": "marginal", "attrs": ["sex"], "from_data": True}]},
        "output": {"formats": ["csv"], "summary": ["md"], "plots": False},
    }
    r = run(raw, data=small_frame, seed=5)
    assert sum(r.ledger["rho"], Fraction(0)) == Fraction(1, 2)
    assert len(r.ledger) == 2 * 4  # a selection and a measurement per round
    assert r.counts.sum() == len(small_frame) and (r.counts >= 0).all()
    # the invariant (published from the data) holds exactly after rounding
    truth = Marginal(r.plan.domain, ("sex",)).answer(Dataset.from_frame(small_frame, r.plan.domain))
    assert np.array_equal(Marginal(r.plan.domain, ("sex",)).matvec(r.counts), truth)
    assert r.report["constraints_all_hold"]


# ---- the two model specs on the real data --------------------------------------------------------


def _check_common(r, out: Path, n_records: int) -> None:
    acc = r.accountant
    assert sum(r.ledger["epsilon"], Fraction(0)) == acc.total.epsilon == 1  # exactly the budget
    assert r.report["privacy"]["ledger_sums_to_budget"] and not r.report["privacy"]["unspent"]
    assert r.counts.dtype == np.int64 and (r.counts >= 0).all()
    counts = r.table["count"].to_numpy()
    assert counts.dtype.kind == "i" and (counts >= 0).all() and counts.sum() == r.counts.sum()
    assert len(r.synthetic) == r.counts.sum()
    for label, frame in r.marginals.items():
        attrs = tuple(label.split(", "))
        assert np.array_equal(frame["count"].to_numpy(), Marginal(r.plan.domain, attrs).matvec(r.counts))
    report = json.loads((out / "report.json").read_text())
    assert report["algorithm"]["name"] == r.spec.algorithm.name
    assert "## Algorithm" in (out / "summary.md").read_text()
    for name in ("release.csv", "synthetic.csv"):
        assert (out / name).is_file()
    assert r.report["released"]["total"] == r.counts.sum()
    assert r.report["constraints_all_hold"]


def test_czech_barak_spec_on_the_real_data(tmp_path):
    data = shared_data("czech.csv")
    r = run(REPO / "models" / "czech_barak.toml", data=data, out=tmp_path / "out", seed=11)
    _check_common(r, tmp_path / "out", 1841)
    (m,) = r.measurements
    assert m.query.num_rows == 1 + 6 + 15 and m.noise == "discrete_laplace"
    assert len(r.marginals) == 15
    # Total behaviour: the total is noisy. The true table is feasible for the LP, so the
    # released parities are within max|noise| of the noisy ones; hence the total is within
    # 2 max|noise| of the truth, plus at most 1/2 per cell from rounding.
    truth = m.query.answer(Dataset.from_csv(data, r.plan.domain))
    assert truth[0] == 1841
    max_noise = np.abs(m.values - truth).max()
    assert abs(int(r.counts.sum()) - 1841) <= 2 * max_noise + r.plan.domain.size / 2


def test_nltcs_mwem_spec_on_the_real_data(tmp_path):
    data = shared_data("nltcs.csv")
    r = run(REPO / "models" / "nltcs_mwem.toml", data=data, out=tmp_path / "out", seed=13)
    _check_common(r, tmp_path / "out", 21574)
    assert r.counts.sum() == 21574  # MWEM treats the record count as public: it is the total
    assert len(r.ledger) == 2 * 30 and len(r.marginals) == 120
    assert any("NOT protected" in note for note in r.report["algorithm"]["notes"])



@pytest.mark.filterwarnings("ignore::UserWarning")
def test_adaptive_ledger_rows_name_their_mechanism_and_noise():
    """Steps an adaptive plan charges at run time (auto's wide selection: no plan lists its rounds)
    still show their mechanism and noise in the report, read off the measurement of the same label
    or the exponential mechanism's charge; long exact fractions are shortened in the readable table
    only. 10 attributes of 33 values: every triple's relaxation (4.31 M cells) is beyond
    ALL_L2_CELLS, so the plan selects."""
    from dpopt.report import summary_blocks

    gen = np.random.default_rng(3)
    codes = (gen.integers(0, 33, size=(3000, 1)) + gen.integers(0, 3, size=(3000, 10))) % 33
    frame = pd.DataFrame(codes, columns=[f"b{i}" for i in range(10)])
    raw = {"domain": {"attributes": {c: 33 for c in frame.columns}}, "data": {"source": "file"},
           "privacy": {"accounting": "zcdp", "rho": "1/2"}, "workload": {"marginals": "all 3-way"},
           "output": {"formats": ["csv"], "summary": ["md"], "plots": False}}
    r = run(raw, data=frame, seed=5)
    assert r.info["wide_selection"]["mode"] == "select"
    ledger = r.report["privacy"]["ledger"]
    planned = {m.label for m in r.plan.steps}
    drawn = {m.label: m for m in r.measurements}
    rounds = [e for e in ledger if e["label"] not in planned]
    measured = [e for e in rounds if e["label"] in drawn]
    selected = [e for e in rounds if e["label"] not in drawn]
    assert len(measured) == len(selected) == len(r.info["wide_selection"]["chosen"]) > 0
    for e in measured:
        m = drawn[e["label"]]
        assert e["mechanism"] == m.noise.removeprefix("discrete_") == "gaussian"
        assert e["noise_stddev"] == m.stddev > 0
    assert all(e["mechanism"] == "exponential" and "noise_stddev" not in e for e in selected)
    (table,) = [b for b in summary_blocks(r.report) if b[0] == "table" and b[1][0] == "measurement"]
    assert any(len(e["rho"]) > 16 for e in rounds)  # the rounds' exact shares are long fractions
    for e, row in zip(ledger, table[2]):
        assert row[1] == e.get("mechanism", "")
        assert row[2] == (e["rho"] if len(e["rho"]) <= 16 else f"{e['rho_float']:.4g}")
