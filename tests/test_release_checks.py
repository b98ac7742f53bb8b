"""Decisions made before any budget is spent (issue #24 items 7 and 8).

Item 7, deterministic resource decisions: the memory limit is a fixed share of the machine's
memory (or DPOPT_MEMORY_LIMIT), never the memory available at the moment; a least-squares fit
with bounds only whose explicit solve does not fit takes the matrix-free path, which gives the
explicit solve's estimate; ``dpopt check`` prints the solve.

Item 8, early one-line checks: duplicated column names are an error naming the column; data with
no records warn; noise above the number of records warns (without stating it); synthetic
records whose number the noise would set are refused by the plan.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from dpopt.cli import main
from dpopt.errors import DataError, DataWarning, MemoryWarning, SolverError, SpecError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.release import plan, run
from dpopt.release import resources
from dpopt.release.checks import _total_weight, noise_on_total

ATTRS = {"a": 10, "b": 10, "c": 10}


def spec(epsilon=1.0, synthetic=False, integer=False, **constraints) -> dict:
    return {
        "name": "checks",
        "domain": {"attributes": ATTRS},
        "privacy": {"accounting": "pure", "epsilon": epsilon},
        "measure": [{"label": "a x b", "query": "marginal", "attrs": ["a", "b"], "mechanism": "laplace", "share": 0.5},
                    {"label": "b x c", "query": "marginal", "attrs": ["b", "c"], "mechanism": "laplace", "share": 0.5}],
        "constraints": {"nonnegative": True, "integer": integer, **constraints},
        "output": {"synthetic": synthetic, "plots": False},
    }


@pytest.fixture
def frame(rng) -> pd.DataFrame:
    return pd.DataFrame({a: rng.integers(0, k, 3000) for a, k in ATTRS.items()})


# ---- item 7: the memory limit ------------------------------------------------------------------------------------
def test_the_default_limit_is_a_share_of_the_machines_memory_not_of_what_is_free(monkeypatch):
    monkeypatch.delenv("DPOPT_MEMORY_LIMIT", raising=False)
    total, _ = resources.machine_memory()
    limit, source = resources.memory_limit()
    assert limit == pytest.approx(0.75 * total) and "DPOPT_MEMORY_LIMIT overrides" in source
    monkeypatch.setattr(resources, "memory_available_now", lambda: 1.0)  # a machine under heavy load
    assert resources.memory_limit() == (limit, source)
    monkeypatch.setattr(resources, "_cgroup_limit", lambda: total / 4)  # a container with less memory
    limit, source = resources.memory_limit()
    assert limit == pytest.approx(0.75 * total / 4) and "container" in source


@pytest.mark.parametrize("text, expected", [("8G", 8 * 2**30), ("512M", 512 * 2**20), ("1000", 1000.0),
                                            ("none", None)])
def test_dpopt_memory_limit_overrides(monkeypatch, text, expected):
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", text)
    assert resources.memory_limit()[0] == expected


def test_a_plan_under_load_is_accepted_the_same_way_and_warned(monkeypatch, frame):
    monkeypatch.delenv("DPOPT_MEMORY_LIMIT", raising=False)
    quiet = plan(spec(), data=frame)
    monkeypatch.setattr(resources, "memory_available_now", lambda: 1024.0)
    with pytest.warns(MemoryWarning, match=r"only 1\.0 KiB is available at the moment.*not by the moment's"):
        loaded = plan(spec(), data=frame)
    assert (loaded.resources.solve, loaded.resources.total, loaded.resources.limit) == \
        (quiet.resources.solve, quiet.resources.total, quiet.resources.limit)


def _limit_between_paths(monkeypatch, raw, frame):
    """DPOPT_MEMORY_LIMIT between the matrix-free estimate and the default solve's."""
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", "none")
    p = plan(raw, data=frame)
    explicit, lean = resources.estimate_memory(p).total, resources.estimate_memory(p, matrix_free=True).total
    assert lean < explicit
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", str(int((lean + explicit) / 2)))


def test_a_fit_too_large_for_the_explicit_solve_is_solved_matrix_free_not_refused(monkeypatch, frame, capsys,
                                                                                    tmp_path):
    default = run(spec(), data=frame, seed=3)
    assert "lbfgsb" not in default.reconstruction.solver
    _limit_between_paths(monkeypatch, spec(), frame)
    p = plan(spec(), data=frame)
    assert p.resources.solve.startswith("matrix-free") and "above the limit" in p.resources.note
    assert p.algorithm_plan.engine_options == resources.MATRIX_FREE_OPTIONS
    lean = run(spec(), data=frame, seed=3)
    assert "lbfgsb" in lean.reconstruction.solver and lean.reconstruction.success
    # The same noise (seed 3), the same optimum: the objective, and every fitted marginal within a
    # small fraction of a count (the table itself is not unique: two overlapping marginals fix it only
    # up to tables with equal marginals).
    assert lean.reconstruction.fun == pytest.approx(default.reconstruction.fun, rel=1e-6)
    for m in default.measurements:
        fit0, fit1 = m.query.matvec(default.reconstruction.x), m.query.matvec(lean.reconstruction.x)
        assert np.max(np.abs(fit0 - fit1)) < 1e-3 * max(1.0, np.max(np.abs(fit0))), m.label
    path = tmp_path / "spec.toml"
    path.write_text('name = "checks"\n[domain.attributes]\na = 10\nb = 10\nc = 10\n[privacy]\naccounting = "pure"\n'
                    'epsilon = 1\n[[measure]]\nlabel = "a x b"\nquery = "marginal"\nattrs = ["a", "b"]\n'
                    'mechanism = "laplace"\nshare = 0.5\n[[measure]]\nlabel = "b x c"\nquery = "marginal"\n'
                    'attrs = ["b", "c"]\nmechanism = "laplace"\nshare = 0.5\n[constraints]\nnonnegative = true\n')
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert main(["check", str(path), "--data", str(tmp_path / "data.csv")]) == 0
    assert "solve: matrix-free L-BFGS-B" in capsys.readouterr().out


def _wide(cells_per_attr: int, attrs: int, identity: bool) -> dict:
    names = [f"a{i}" for i in range(attrs)]
    measures = [{"label": "a0 x a1", "query": "marginal", "attrs": ["a0", "a1"], "mechanism": "laplace", "share": 0.5}]
    if identity:
        measures.append({"label": "cells", "query": "identity", "mechanism": "laplace", "share": 0.5})
    else:
        measures[0]["share"] = 1.0
    return {"name": "wide", "domain": {"attributes": {a: cells_per_attr for a in names}},
            "privacy": {"accounting": "pure", "epsilon": 1.0}, "measure": measures,
            "constraints": {"nonnegative": True}, "output": {"plots": False}}


def test_the_plan_takes_the_matrix_free_path_only_where_it_needs_less(monkeypatch, tmp_path):
    """10^7 cells, the identity beside a marginal: the default working set would be as wide as the
    domain (petabytes); the matrix-free solve (gigabytes) is planned instead. 10^8 cells and one
    marginal: the table itself is what does not fit, and the refusal names the domain, not a solve."""
    data = tmp_path / "tiny.csv"
    data.write_text(",".join(f"a{i}" for i in range(8)) + "\n" + ",".join("0" * 8) + "\n")
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", "64G")
    p = plan(_wide(10, 7, identity=True), data=data)  # planned only: nothing over 10^7 cells is run here
    assert p.resources.solve.startswith("matrix-free") and "working set of cells" in p.resources.note
    assert p.resources.total < 64 * 2**30 and p.algorithm_plan.engine_options == resources.MATRIX_FREE_OPTIONS
    monkeypatch.setenv("DPOPT_MEMORY_LIMIT", "8G")
    with pytest.raises(resources.ResourceLimitError, match=r"key 'domain': the released table needs about"):
        plan(_wide(10, 8, identity=False), data=data)


def test_a_fit_with_invariants_has_no_matrix_free_path_and_is_refused(monkeypatch, frame):
    raw = spec(invariants=[{"name": "total", "query": "total", "from_data": True}])
    _limit_between_paths(monkeypatch, spec(), frame)
    with pytest.raises(resources.ResourceLimitError, match=r"explicit cvxpy interior-point solve.*drop the "
                                                           r"invariants and inequalities"):
        plan(raw, data=frame)


def test_the_engine_solves_bounds_only_matrix_free_and_refuses_otherwise(frame):
    from dpopt.estimate import reconstruct
    from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
    from dpopt.model.measurement import Measurement
    from dpopt.model.queries.basic import Total
    from dpopt.model.queries.marginal import Marginal

    domain = Domain.from_dict(ATTRS)
    data = Dataset.from_frame(frame, domain)
    gen = np.random.default_rng(5)
    ms = [Measurement(q, q.answer(data) + gen.normal(0, 4.0, q.num_rows), "gaussian", 4.0, 16.0, label=str(attrs))
          for attrs in (("a", "b"), ("b", "c")) for q in [Marginal(domain, attrs)]]
    cs = ConstraintSet(domain, [NonNegativity()])
    qp = reconstruct(ms, cs, "l2", backend="cvxpy", integer=False)
    free = reconstruct(ms, cs, "l2", integer=False, matrix_free=True, working_set=False)
    assert free.success and "lbfgsb" in free.solver
    assert free.fun == pytest.approx(qp.fun, rel=1e-6)
    total = ConstraintSet(domain, [NonNegativity(), Invariant(Total(domain), np.array([3000.0]), "total")])
    with pytest.raises(SolverError, match="matrix_free=True solves problems with bounds only"):
        reconstruct(ms, total, "l2", integer=False, matrix_free=True, working_set=False)


# ---- item 8: before any budget is spent ---------------------------------------------------------------------------
def test_a_column_named_twice_is_an_error_naming_it(tmp_path, frame):
    path = tmp_path / "dup.csv"
    path.write_text("a,b,a,c\n" + "1,2,3,4\n" * 5)
    with pytest.raises(DataError, match=r"the header row names column 'a' twice"):
        Dataset.from_csv(path, Domain.from_dict(ATTRS))
    twice = pd.concat([frame, frame[["b"]]], axis=1)
    with pytest.raises(DataError, match=r"column 'b' twice"):
        Dataset.from_frame(twice, Domain.from_dict(ATTRS))
    parquet = tmp_path / "dup.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table([pa.array([1]), pa.array([2]), pa.array([3]), pa.array([4])], names=["a", "b", "c", "b"]),
                   parquet)
    with pytest.raises(DataError, match=r"names column 'b' twice"):
        Dataset.from_parquet(parquet, Domain.from_dict(ATTRS))


def test_data_without_records_warn_in_one_line_and_an_empty_file_is_an_error(tmp_path, capsys):
    header = tmp_path / "header.csv"
    header.write_text("a,b,c\n")
    with pytest.warns(DataWarning, match=r"hold no records: every released answer will be noise alone"):
        release = run(spec(), data=header, seed=1)
    assert release.success
    nothing = tmp_path / "nothing.csv"
    nothing.write_text("")
    with pytest.raises(DataError, match=r"is empty: not even a header row"):
        run(spec(), data=nothing, seed=1)
    path = tmp_path / "spec.toml"
    path.write_text('name = "checks"\n[domain.attributes]\na = 10\nb = 10\nc = 10\n[privacy]\naccounting = "pure"\n'
                    'epsilon = 1\n[[measure]]\nquery = "marginal"\nattrs = ["a", "b"]\nmechanism = "laplace"\n'
                    'share = 1\n[output]\nplots = false\nsynthetic = false\n')
    assert main(["run", str(path), "--data", str(header), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"dpopt: warning: data {header} hold no records: every released answer will be noise alone"]


def test_noise_above_the_number_of_records_warns_without_stating_it(frame):
    with pytest.warns(DataWarning, match=r"the noise on 2 of 2 measurements \(standard deviation up to 2\.83e\+04, "
                                         r"in 'a x b'\) exceeds the number of records") as caught:
        run(spec(epsilon=1e-4), data=frame, seed=1)
    assert all("3000" not in str(w.message) and "3,000" not in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        run(spec(epsilon=1.0), data=frame, seed=1)


def test_synthetic_records_the_noise_would_count_are_refused_by_the_plan(frame):
    with pytest.raises(SpecError, match=r"key 'output.synthetic': the planned noise leaves the released total "
                                        r"uncertain by about 2e\+10 records"):
        plan(spec(epsilon=1e-9, synthetic=True, integer=True), data=frame)  # no data read, nothing drawn
    plan(spec(epsilon=1e-9, synthetic=False, integer=True), data=frame)
    plan(spec(epsilon=1e-6, synthetic=True, integer=True), data=frame)
    pinned = spec(epsilon=1e-9, synthetic=True, integer=True,
                  invariants=[{"name": "n", "query": "total", "from_data": True}])
    plan(pinned, data=frame)  # the total is the data's: exact
    public = spec(epsilon=1e-9, synthetic=True, integer=True,
                  invariants=[{"name": "n", "query": "total", "values": [6e7]}])
    with pytest.raises(SpecError, match=r"the invariants fix the released total at 60,000,000"):
        plan(public, data=frame)


def test_the_noise_on_the_total_matches_the_least_norm_estimate(frame):
    """Closed form for marginals (rows x sigma^2, combined by precision), numpy's pseudo-inverse otherwise."""
    from dpopt.model.queries.fourier import FourierParity
    from dpopt.model.queries.marginal import Marginal
    from dpopt.model.queries.hierarchical import Hierarchical

    p = plan(spec(), data=frame)
    sigmas = [s.stddev for s in p.steps]
    assert noise_on_total(p) == pytest.approx((sum(1 / (100 * s * s) for s in sigmas)) ** -0.5)
    small = Domain.from_dict({"x": 2, "y": 2, "z": 2})
    queries = [Marginal(small, ("x",)), FourierParity(small, [(), ("x",), ("y", "z")]),
               Hierarchical(Domain.from_dict({"v": 16}), "v")]
    for q in queries:
        A = q.to_dense()
        u = np.linalg.pinv(A.T) @ np.ones(A.shape[1])
        assert _total_weight(q) == pytest.approx(float(u @ u), rel=1e-6), q.name
    assert _total_weight(FourierParity(small, [("x",)])) is None  # one parity does not determine the total
