"""The marginal-space estimator's total (issue 27): free, held at its measured estimate, or public.

The rule of :mod:`dpopt.estimate.marginal_space.total` against its closed forms (the clipping
bias by quadrature and by simulation, the held value and its variance), its decision on
constructed cases each way, the held estimate against the dense constrained least squares with
that equality (brute force), public totals' priority, and the decision's independence of the
data behind fixed noisy answers.
"""

import functools
import math

import numpy as np
import pytest
from scipy import integrate, stats

from dpopt.errors import ParameterError
from dpopt.estimate import reconstruct
from dpopt.estimate.marginal_space import estimate_marginals as _estimate_marginals
from dpopt.estimate.marginal_space.total import choose_total, clipping_bias
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Marginal, Total

# These tests are of the least-squares estimate: objective 'l2' unless a test names another.
estimate_marginals = functools.partial(_estimate_marginals, objective="l2")

DOM = Domain(("a", "b", "c", "d", "e"), (2, 3, 2, 3, 2))
CHAIN = [("a", "b", "c"), ("b", "c", "d"), ("c", "d", "e")]  # decomposable: the local polytope is exact
SPACE = {"exact_cells": 0}


def measured(x, sets, sigma, gen, noise="gaussian"):
    out = []
    for s in sets:
        q = Marginal(DOM, s)
        out.append(Measurement(q, q.matvec(x) + gen.normal(0, sigma, q.num_rows), noise, sigma, sigma**2,
                               label=", ".join(s)))
    return out


def closed_form_total(ms):
    """Equation (2): the inverse-variance average of the measured totals and its variance."""
    w = np.array([1.0 / (m.variance * m.query.num_rows) for m in ms])
    totals = np.array([m.values.sum() for m in ms])
    return float(w @ totals / w.sum()), 1.0 / float(w.sum())


def sparse_case(gen):
    x = np.zeros(DOM.size)
    x[gen.choice(DOM.size, 6, replace=False)] = gen.integers(1, 4, 6)  # ~12 records on 72 cells
    return x, measured(x, CHAIN, 6.0, gen)


# ---- the clipping bias, equation (1) ---------------------------------------------------------------
@pytest.mark.parametrize("t", [0.0, 0.3, 1.5, 4.0])
def test_clipping_bias_is_the_mean_positive_part_of_the_noise(t):
    """``g(t) = E[max(0, Z − t)]`` for unit-variance Gaussian and Laplace noise, by quadrature."""
    exact = {"epsabs": 0, "epsrel": 1e-13}
    gauss = integrate.quad(lambda u: u * stats.norm.pdf(u + t), 0, 40, **exact)[0]
    b = 1 / math.sqrt(2)
    lap = integrate.quad(lambda u: u * stats.laplace.pdf(u + t, scale=b), 0, 60, **exact)[0]
    assert clipping_bias(t, False) == pytest.approx(gauss, rel=1e-9, abs=1e-15)
    assert clipping_bias(t, True) == pytest.approx(lap, rel=1e-9, abs=1e-15)
    assert clipping_bias(0.0, False) == pytest.approx(1 / math.sqrt(2 * math.pi))


def test_clipping_bias_summed_over_cells_matches_simulation_and_the_jensen_bound(rng):
    """Clipping ``c + σZ`` at zero inflates a marginal's sum by ``Σ σ g(c_i/σ)`` (simulated), and
    that is at least the even spread's ``D σ g(n/(Dσ))``, the rule's lower bound (4)."""
    counts = np.zeros(400)
    counts[:25] = rng.integers(1, 30, 25)
    sigma = 5.0
    draws = np.maximum(counts + sigma * rng.standard_normal((4000, counts.size)), 0).sum(axis=1) - counts.sum()
    exact = float(np.sum(sigma * clipping_bias(counts / sigma, False)))
    assert draws.mean() == pytest.approx(exact, abs=4 * draws.std() / math.sqrt(draws.size))
    bound = counts.size * sigma * float(clipping_bias(counts.sum() / (counts.size * sigma), False))
    assert bound <= exact
    assert bound > 0.5 * exact  # sparse: most of the bias is the empty cells', which the bound sees


# ---- the decision ------------------------------------------------------------------------------------
def test_rule_holds_on_sparse_noisy_marginals_and_frees_dense_precise_ones():
    """Equations (3)–(5) by hand: a marginal of 10^5 cells at σ = 30 over 5·10^4 records is held; 8
    cells at σ = 1 over the same records is free (its bias is ~0)."""
    n, cells, var = 5e4, np.array([1e5, 1e4]), np.array([900.0, 900.0])
    w = float(np.sum(1 / (var * cells)))
    sparse = choose_total("auto", n, w, cells, var, np.zeros(2, bool), public=False, nonnegative=True)
    expected = float(np.sum(clipping_bias(n / (cells * 30.0), False) / 30.0) / w)
    assert sparse.held and sparse.bias == pytest.approx(expected, rel=1e-12)
    assert sparse.stddev == pytest.approx(1 / math.sqrt(w)) and sparse.bias > sparse.stddev
    dense = choose_total("auto", n, 1 / 8, np.array([8.0]), np.array([1.0]), np.zeros(1, bool), public=False,
                         nonnegative=True)
    assert not dense.held and dense.bias < 1e-12 < dense.stddev
    assert not choose_total("auto", n, w, cells, var, np.zeros(2, bool), public=False, nonnegative=False).held
    assert choose_total("measured", n, 1 / 8, np.array([8.0]), np.array([1.0]), np.zeros(1, bool), public=False,
                        nonnegative=True).held
    assert not choose_total("free", n, w, cells, var, np.zeros(2, bool), public=False, nonnegative=True).held


def test_estimator_decides_each_way_and_says_why(rng):
    x, sparse = sparse_case(rng)
    est = estimate_marginals(sparse, **SPACE)
    assert est.success and est.info["total"]["held"] and est.info["total"]["mode"] == "auto"
    assert "held at n̂" in est.message and "predicted bias" in est.info["total"]["reason"]
    dense_x = rng.poisson(300, DOM.size).astype(float)
    precise = measured(dense_x, CHAIN, 1.0, rng)
    est = estimate_marginals(precise, **SPACE)
    assert est.success and not est.info["total"]["held"]
    assert "free (bias within the standard error)" in est.message


# ---- the held value and the held fit -------------------------------------------------------------
@pytest.mark.parametrize("route", [SPACE, {}])  # marginal space and the small domain's table
def test_held_estimate_is_the_dense_least_squares_with_that_total(route, rng):
    """The held total is equation (2)'s n̂; the estimate equals the dense non-negative least
    squares with the equality ``1ᵀx = n̂`` (brute force through the dense engine), and differs
    from the free fit, whose total the clipping inflated."""
    x, ms = sparse_case(rng)
    n_hat, var = closed_form_total(ms)
    est = estimate_marginals(ms, **route)
    assert est.status is Status.OPTIMAL, est.message
    assert est.info["total"]["held"]
    assert est.total == pytest.approx(n_hat, rel=1e-9)
    assert est.info["total"]["value"] == pytest.approx(n_hat, rel=1e-12)
    assert est.info["total"]["stddev"] == pytest.approx(math.sqrt(var), rel=1e-12)
    cs = ConstraintSet(DOM, [NonNegativity(), Invariant(Total(DOM), np.array([n_hat]), name="n hat")])
    dense = reconstruct(ms, cs, "l2")
    assert dense.success
    for s in CHAIN:
        np.testing.assert_allclose(est.marginal(s), Marginal(DOM, s).matvec(dense.x), atol=2e-3 * (1 + x.sum()) ** 0.5)
    assert est.fun == pytest.approx(dense.fun, rel=1e-5, abs=1e-6)
    free = estimate_marginals(ms, total="free", **route)
    assert free.success and not free.info["total"]["held"]
    assert free.total > n_hat + est.info["total"]["stddev"]  # the inflation the rule predicted
    assert free.fun < est.fun  # the free fit is the unconstrained-total optimum of the same objective


def test_unconstrained_fit_total_is_the_held_value(rng):
    """Without non-negativity the fit's total is n̂ already (block-diagonal normal equations), and
    ``auto`` leaves it free."""
    _, ms = sparse_case(rng)
    n_hat, _ = closed_form_total(ms)
    est = estimate_marginals(ms, nonnegative=False, **SPACE)
    assert not est.info["total"]["held"] and est.total == pytest.approx(n_hat, rel=1e-12)


def test_a_negative_estimate_is_held_at_zero(rng):
    """Heavy noise can make n̂ negative; under non-negativity the nearest feasible total is 0."""
    x = np.zeros(DOM.size)
    ms = [Measurement(m.query, m.values - 5.0, m.noise, m.scale, m.variance, label=m.label)
          for m in measured(x, CHAIN, 6.0, rng)]
    n_hat, _ = closed_form_total(ms)
    assert n_hat < 0
    for route in (SPACE, {}):
        est = estimate_marginals(ms, **route)
        assert est.success and est.info["total"]["held"] and est.info["total"]["value"] == 0.0
        assert est.total == pytest.approx(0.0, abs=1e-6)
        assert "nearest to n̂ < 0" in est.message


# ---- priority, privacy, input ----------------------------------------------------------------------
def test_a_public_total_keeps_priority(rng):
    x, ms = sparse_case(rng)
    public = float(x.sum())
    for kwargs in ({"total": public},
                   {"constraints": ConstraintSet(DOM, [Invariant(Total(DOM), np.array([public]), name="n")])}):
        est = estimate_marginals(ms, **kwargs, **SPACE)
        assert est.success and est.info["total"]["mode"] == "public" and est.info["total_public"]
        assert est.info["total"]["value"] == public and math.isnan(est.info["total"]["measured"])  # none estimated
        assert est.total == pytest.approx(public, rel=1e-9)


def test_choice_reads_no_data_behind_fixed_noisy_answers(rng):
    """Two tables with different record counts behind the same noisy answers: the same choice, the
    same estimate (the rule sees the answers' sum, the noise scales and the cells, nothing else)."""
    x1, ms = sparse_case(rng)
    x2 = rng.poisson(50, DOM.size).astype(float)  # ~3,600 records
    swapped = [Measurement(m.query, m.values.copy(), m.noise, m.scale, m.variance, label=m.label,
                           info={"true_total": float(x2.sum())}) for m in ms]
    a, b = estimate_marginals(ms, **SPACE), estimate_marginals(swapped, **SPACE)
    assert a.info["total"] == b.info["total"]
    np.testing.assert_array_equal(a.residuals, b.residuals)


def test_laplace_measurements_use_the_laplace_bias(rng):
    x, _ = sparse_case(rng)
    ms = measured(x, CHAIN, 6.0, rng, noise="laplace")
    n_hat, var = closed_form_total(ms)
    cells = np.array([m.query.num_rows for m in ms], float)
    expected = float(np.sum(clipping_bias(max(n_hat, 0) / (cells * 6.0), True) / 6.0) * var)
    est = estimate_marginals(ms, **SPACE)
    assert est.info["total"]["predicted_bias"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["bogus", -1.0, float("nan"), None, True])
def test_bad_total_is_one_line_error(bad, rng):
    _, ms = sparse_case(rng)
    with pytest.raises(ParameterError, match="total must be") as err:
        estimate_marginals(ms, total=bad, **SPACE)
    assert "\n" not in str(err.value)


# ---- the spec faces: [marginal_space] total and [auto] total -----------------------------------------
def records_of(x):
    """The records behind a table of counts over DOM (one row per record; labels are the codes)."""
    import pandas as pd

    codes = np.column_stack(np.unravel_index(np.repeat(np.arange(DOM.size), x.astype(int)), DOM.sizes))
    return pd.DataFrame(codes, columns=list(DOM.attrs))


def space_spec(**marginal_space):
    return {"name": "total-face", "algorithm": "marginal_space",
            "domain": {"attributes": dict(zip(DOM.attrs, DOM.sizes))}, "data": {"source": "file"},
            "privacy": {"accounting": "pure", "epsilon": 1},
            "measure": [{"label": ", ".join(s), "query": "marginal", "attrs": list(s), "mechanism": "laplace",
                         "share": "1/3"} for s in CHAIN],
            "marginal_space": {"exact_cells": 0, "records": False, "objective": "l2", **marginal_space},
            "output": {"formats": ["csv"], "plots": False}}


@pytest.mark.filterwarnings("ignore::UserWarning")  # a seeded run is not private: a test input
@pytest.mark.parametrize("mode", ["free", "measured", "auto"])
def test_spec_total_reaches_the_estimator_and_the_report(mode, rng):
    """``[marginal_space] total`` is the estimator's ``total=``; the release's info, report.json's
    algorithm section and the summary's notes carry the choice and its evidence."""
    from dpopt.release import run

    x, _ = sparse_case(rng)
    spec = space_spec() if mode == "auto" else space_spec(total=mode)
    release = run(spec, data=records_of(x), seed=3)
    assert release.success
    chosen = release.reconstruction.info["total"]
    assert release.info["total"] == chosen and chosen["mode"] == mode
    if mode != "auto":
        assert chosen["held"] is (mode == "measured")
    if chosen["held"]:
        assert release.reconstruction.total == pytest.approx(chosen["measured"], rel=1e-9)
    reported = release.report["algorithm"]["total"]
    assert {k: reported[k] for k in ("mode", "held", "measured", "stddev", "reason")} == \
        {k: chosen[k] for k in ("mode", "held", "measured", "stddev", "reason")}
    assert reported["predicted_bias"] == pytest.approx(chosen["predicted_bias"], rel=1e-12)
    note = next(n for n in release.report["algorithm"]["notes"] if n.startswith("Record count"))
    assert f"[marginal_space] total = {mode!r}" in note and "predicted bias" in note


@pytest.mark.parametrize("bad, says", [("bogus", "unknown value 'bogus'"), (48842, "invariant"),
                                       (True, "must be a string")])
def test_spec_bad_total_is_one_line_error_naming_the_key(bad, says, rng):
    from dpopt.errors import SpecError
    from dpopt.release import plan

    x, _ = sparse_case(rng)
    with pytest.raises(SpecError, match="marginal_space.total") as err:
        plan(space_spec(total=bad), data=records_of(x))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_auto_total_is_refused_free_on_the_dense_table(rng):
    """The dense fit always holds the total; ``[auto] total = "free"`` is refused there (it reaches
    the estimator beyond the dense table: ``test_wide_specs``)."""
    from dpopt.errors import SpecError
    from dpopt.release import plan

    x, _ = sparse_case(rng)
    spec = {"name": "dense-auto", "domain": {"attributes": dict(zip(DOM.attrs, DOM.sizes))},
            "data": {"source": "file"}, "privacy": {"accounting": "pure", "epsilon": 1},
            "workload": {"marginals": [list(s) for s in CHAIN]}, "auto": {"total": "free"}}
    with pytest.raises(SpecError, match="auto.total") as err:
        plan(spec, data=records_of(x))
    assert "beyond the dense table" in str(err.value) and "\n" not in str(err.value)
    spec["auto"]["total"] = "measured"
    assert plan(spec, data=records_of(x)).algorithm.params.total == "measured"
