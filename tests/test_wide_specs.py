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
