"""Barak et al. (PODS 2007) Fourier release: measurement scale, consistency methods, LP, shift."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.stats import binom

from dpopt.algorithms.barak import (
    METHODS,
    barak_release,
    fourier_consistency,
    fourier_plan,
    measure_fourier,
    shift_amount,
    shift_probability,
    theorem5_bound,
)
from dpopt.errors import DataError, ParameterError, PrivacyParameterError, QueryError, SolverError
from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity, StructuralZeros
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Total
from dpopt.model.queries.fourier import FourierParity, downward_closure
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.randomness import make_random
from dpopt.privacy.samplers import discrete_gaussian_variance, discrete_laplace_variance


def binary_data(k: int, n: int, seed: int, sparse: bool = True) -> Dataset:
    """Records over k binary attributes, correlated, with many empty cells."""
    gen = np.random.default_rng(seed)  # test data only, not privacy noise
    base = gen.integers(0, 2, size=(n, 1))
    flip = gen.random((n, k)) < (0.15 if sparse else 0.45)
    codes = (base ^ flip).astype(np.int64)
    domain = Domain(tuple(f"a{i}" for i in range(k)), (2,) * k)
    return Dataset(codes, domain)


def mixed_data(n: int = 300, seed: int = 3) -> Dataset:
    """Non-binary attributes (3, 2, 5 values): the binary encoding has unused codes."""
    gen = np.random.default_rng(seed)
    domain = Domain(("x", "y", "z"), (3, 2, 5))
    codes = np.stack([gen.integers(0, 3, n), gen.integers(0, 2, n), gen.integers(0, 5, n)], axis=1)
    return Dataset(codes, domain)


def exact_measurement(plan, data) -> Measurement:
    """The true coefficients, labelled with unit Laplace-like variance so they enter the loss."""
    bdata = Dataset(plan.encoding.encode_codes(data.codes), plan.domain) if plan.encoding else data
    true = plan.query.answer(bdata)
    return Measurement(plan.query, true, "discrete_laplace", 1.0, 1.0, label="exact")


# ---- plan and measurement -----------------------------------------------------------------------
def test_plan_closure_and_unused_codes():
    data = mixed_data()
    plan = fourier_plan(data.domain, [("x", "z"), ("y",)])
    # x: 2 bits, y: 1 bit, z: 3 bits; B = all subsets of the 5 bits of {x,z} plus {y#0}.
    assert plan.closure_size == 2**5 + 1
    assert plan.marginal_bits(("z", "x")) == ("x#0", "x#1", "z#0", "z#1", "z#2")
    cs = ConstraintSet(plan.domain, plan.unused_code_zeros())
    unused = plan.encoding.structural_zero_mask()
    assert np.array_equal(cs.zero_mask(), unused)
    assert fourier_plan(data.domain, 1).marginals == (("x",), ("y",), ("z",))


def test_laplace_scale_derived_from_sensitivity():
    data = binary_data(6, 200, 0)
    plan = fourier_plan(data.domain, 2)
    b = plan.closure_size
    m = measure_fourier(plan, data, Accountant.pure(0.5), make_random(1))
    assert plan.query.sensitivity(1) == b
    assert m.scale == pytest.approx(b / 0.5)
    # the paper's normalised calibration |B| / (eps 2^{k/2})
    assert m.scale / 2 ** (len(data.domain) / 2) == pytest.approx(b / (0.5 * 2**3))
    assert np.array_equal(m.values, np.round(m.values))  # integers: exact discrete noise


def _noise_draws(plan, data, reps, **budget):
    true = plan.query.answer(data)
    rng = make_random(11)
    draws = []
    for _ in range(reps):
        acc = Accountant.zcdp(budget["rho"]) if "rho" in budget else Accountant.pure(budget["epsilon"])
        draws.append(measure_fourier(plan, data, acc, rng).values - true)
    return np.concatenate(draws), draws


def test_laplace_noise_matches_claimed_scale():
    data = binary_data(5, 100, 1)
    plan = fourier_plan(data.domain, 2)
    noise, _ = _noise_draws(plan, data, 400, epsilon=2.0)  # 16 * 400 draws
    b = plan.closure_size / 2.0
    var = discrete_laplace_variance(b)
    # mean |Z| of the discrete Laplace law: 2p/(1-p^2) with p = exp(-1/b)
    p = math.exp(-1 / b)
    mean_abs = 2 * p / (1 - p * p)
    n = noise.size
    se = math.sqrt((var - mean_abs**2) / n)
    assert abs(np.abs(noise).mean() - mean_abs) < 5 * se
    assert abs(noise.var() / var - 1) < 0.1
    # power: 0.7x and 1.3x the scale are rejected
    for wrong in (0.7 * b, 1.3 * b):
        q = math.exp(-1 / wrong)
        assert abs(np.abs(noise).mean() - 2 * q / (1 - q * q)) > 5 * se


def test_gaussian_noise_matches_claimed_scale():
    data = binary_data(5, 100, 2)
    plan = fourier_plan(data.domain, 2)
    noise, _ = _noise_draws(plan, data, 300, rho=0.5)
    sigma2 = plan.closure_size / (2 * 0.5)  # squared L2 sensitivity |B| / (2 rho)
    var = discrete_gaussian_variance(sigma2)
    se = var * math.sqrt(2 / noise.size)
    assert abs(noise.var() - var) < 5 * se
    assert abs(noise.mean()) < 5 * math.sqrt(var / noise.size)
    for wrong in (0.7, 1.3):
        assert abs(noise.var() - wrong**2 * var) > 5 * se


# ---- noise-free reconstruction ------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_noise_free_reconstructs_requested_marginals(method):
    data = binary_data(6, 300, 4)
    plan = fourier_plan(data.domain, [("a0", "a1", "a2"), ("a2", "a4"), ("a5",)])
    m = exact_measurement(plan, data)
    options = {"engine_options": {"max_passes": 20000, "tol": 1e-10}} if method == "entropy" else {}
    if method == "shift":
        m = Measurement.exact(plan.query, m.values)
    r = fourier_consistency(plan, m, method, integer=False, truth=data, **options)
    assert r.success, r.message
    for attrs in plan.marginals:
        tol = 1e-3 if method == "entropy" else 1e-6
        np.testing.assert_allclose(r.marginal(attrs)["count"], data.marginal(attrs), atol=tol * data.total)
    assert (r.bounds["l1_error"] <= 1e-3 * data.total).all()


@pytest.mark.parametrize("method", ["linf", "l1", "l2", "entropy"])
def test_noise_free_non_binary_keeps_unused_codes_empty(method):
    data = mixed_data()
    plan = fourier_plan(data.domain, [("x", "y"), ("y", "z")])
    options = {"engine_options": {"max_passes": 20000, "tol": 1e-10}} if method == "entropy" else {}
    r = fourier_consistency(plan, exact_measurement(plan, data), method, integer=False, **options)
    assert r.success, r.message
    unused = plan.encoding.structural_zero_mask()
    assert np.abs(r.binary_table[unused]).max() <= 1e-9
    for attrs in plan.marginals:
        np.testing.assert_allclose(r.marginal(attrs)["count"], data.marginal(attrs), atol=1e-3 * data.total)


def test_noisy_release_keeps_structural_zeros_and_invariants():
    data = mixed_data()
    zeros = StructuralZeros("x == 2 and z >= 3", name="rule")
    truth = data.histogram()
    forbidden = ConstraintSet(data.domain, [zeros]).zero_mask()
    clean = Dataset.from_histogram(np.where(forbidden, 0, truth), data.domain)
    total = Invariant(Total(data.domain), [clean.total], name="total")
    cs = ConstraintSet(data.domain, [zeros, total])
    for method in ("linf", "l1", "l2", "entropy"):
        options = {"max_passes": 300} if method == "entropy" else {}
        r = barak_release(clean, [("x", "z")], epsilon=1, method=method, constraints=cs, rng=make_random(5),
                          engine_options=options)
        assert r.counts is not None, (method, r.message)
        assert r.counts.dtype == np.int64 and (r.counts >= 0).all()
        assert r.counts.sum() == clean.total, method
        assert (r.counts[forbidden] == 0).all(), method
        assert r.ledger["epsilon"].sum() == 1


# ---- the LP against a dense LP ----------------------------------------------------------------------
def dense_linf(plan, m):
    """min b  s.t.  -b <= F w - y <= b,  w >= 0,  with F the dense parity matrix (scipy HiGHS)."""
    F = plan.query.to_dense()
    rows, n = F.shape
    c = np.r_[np.zeros(n), 1.0]
    A = np.block([[F, -np.ones((rows, 1))], [-F, -np.ones((rows, 1))]])
    ub = np.r_[m.values, -m.values]
    sol = linprog(c, A_ub=A, b_ub=ub, bounds=[(0, None)] * (n + 1), method="highs-ds")
    assert sol.status == 0
    return sol.fun


@pytest.mark.parametrize("column_generation", [False, True])
def test_linf_optimum_equals_dense_lp(column_generation):
    data = binary_data(9, 150, 6)  # 512 cells, |B| = 46: the masters start below the domain
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(1), make_random(8))
    r = fourier_consistency(plan, m, "linf", integer=False, engine_options={"column_generation": column_generation})
    assert r.success and r.lp["status"] == "OPTIMAL"
    assert r.lp["column_generation"] == column_generation
    expected = dense_linf(plan, m)
    assert r.lp["max_coefficient_error"] == pytest.approx(expected, rel=1e-6, abs=1e-6)
    achieved = np.abs(plan.query.matvec(r.binary_table) - m.values).max()
    assert achieved == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert r.lp["rows"] == 2 * plan.closure_size


def test_linf_rounded_release_is_integer_and_bounded():
    data = binary_data(8, 400, 9)
    plan = fourier_plan(data.domain, 2)
    eps = 1.0
    r = barak_release(data, 2, epsilon=eps, method="linf", rng=make_random(10), evaluate=True)
    assert r.counts.dtype == np.int64 and (r.counts >= 0).all()
    for attrs, frame in r.marginals.items():
        np.testing.assert_array_equal(frame["count"], Marginal(data.domain, attrs).matvec(r.counts))
    b = plan.closure_size
    assert r.bounds["theorem5_bound"].iloc[0] == pytest.approx(4 * 2 * b * math.log(b / 0.05) / eps + b)
    assert r.bounds["within_bound"].all()


# ---- the shift (Theorem 6 / Corollary 1) --------------------------------------------------------------
def test_shift_amount_matches_paper_calibration():
    data = binary_data(6, 100, 12)
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(0.5), make_random(13))
    b, k = plan.closure_size, 6
    r = fourier_consistency(plan, m, "shift", t=3.0)
    assert r.shift["amount_normalized"] == pytest.approx(3.0 * b**2 / (0.5 * 2 ** (k / 2)))
    assert r.shift["paper_probability"] == pytest.approx(1 - math.exp(-3.0))
    # at t = 3 the paper's shift certifies more than its claim: sum |z| (mean |B| b) rarely reaches 3 |B| b
    assert r.shift["probability_bound"] > 1 - math.exp(-3.0)
    assert r.shift["probability_bound"] == pytest.approx(shift_probability(m, r.shift["amount"]))
    assert r.table is None and r.lp == {}


def test_exact_calibration_is_the_smallest_certified_shift():
    data = binary_data(6, 100, 12)
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(0.5), make_random(13))
    for t in (0.5, 1.0, 3.0):
        amount = shift_amount(m, t, "exact")
        assert amount == int(amount)
        assert shift_probability(m, amount) >= 1 - math.exp(-t)
        assert shift_probability(m, amount - 1) < 1 - math.exp(-t)
    # below the paper's shift for t > 1, above it at t = 1/2 (where the paper's claim fails)
    assert shift_amount(m, 3.0, "exact") < shift_amount(m, 3.0)
    assert shift_amount(m, 0.5, "exact") > shift_amount(m, 0.5)
    with pytest.raises(ParameterError, match="calibration"):
        shift_amount(m, 1.0, "loose")


@pytest.mark.parametrize("calibration,t", [("paper", 1.0), ("paper", 2.0), ("exact", 1.0), ("exact", 2.0)])
def test_shift_certifies_the_reported_probability(calibration, t):
    """Simulation: the sufficient event sum |z| <= shift occurs at the computed rate, and the
    released marginals are non-negative at least that often."""
    data = binary_data(6, 60, 14)  # many empty cells: unshifted marginals go negative
    plan = fourier_plan(data.domain, 2)
    exact = plan.query.matvec(data.histogram().astype(float))
    rng = make_random(15)
    reps, covered, ok, unshifted_ok = 300, 0, 0, 0
    for _ in range(reps):
        m = measure_fourier(plan, data, Accountant.pure(1), rng)
        shifted = fourier_consistency(plan, m, "shift", t=t, shift_calibration=calibration)
        covered += np.abs(np.asarray(m.values) - exact).sum() <= shifted.shift["amount"]
        ok += all((f["count"] >= -1e-9).all() for f in shifted.marginals.values())
        plain = fourier_consistency(plan, m, "shift", t=1e-12)
        unshifted_ok += all((f["count"] >= -1e-9).all() for f in plain.marginals.values())
    p = shifted.shift["probability_bound"]
    # two-sided binomial test at level 1e-4 that the event's rate is the computed one
    assert 1e-4 / 2 < binom.cdf(covered, reps, p) and binom.sf(covered - 1, reps, p) > 1e-4 / 2
    assert binom.cdf(ok, reps, p) > 1e-4  # one-sided: non-negativity at least as often
    if calibration == "exact":
        assert p >= 1 - math.exp(-t)
    assert unshifted_ok < ok  # the shift is what makes the marginals non-negative


def test_paper_shift_at_t_1_certifies_less_than_its_claim():
    """sum |z| has mean |B| b, so the paper's t |B| b at t = 1 is about its median."""
    data = binary_data(6, 60, 14)
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(1), make_random(16))
    p = shift_probability(m, shift_amount(m, 1.0))
    assert 0.45 < p < 1 - math.exp(-1.0)


def test_gaussian_shift_amount():
    data = binary_data(5, 80, 16)
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.zcdp(1), make_random(17))
    b = plan.closure_size
    sigma = math.sqrt(b / 2)
    assert shift_amount(m, 2.0) == pytest.approx(sigma * math.sqrt(b * (b + 2 * math.sqrt(2 * b) + 4)))
    assert shift_amount(m, 2.0, "exact") == shift_amount(m, 2.0)
    assert shift_probability(m, shift_amount(m, 2.0)) == pytest.approx(1 - math.exp(-2.0))
    assert shift_probability(m, 0.5 * b * sigma) == 0.0  # below sqrt(|B|) sigma sqrt(|B|): nothing certified


@pytest.mark.parametrize("seed", [0, 1])
def test_l1_column_generation_keeps_unused_codes_empty_and_matches_the_full_lp(seed):
    """Non-binary attributes: the interior-point start works on the free cells only."""
    data = mixed_data()
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(1), make_random(seed))
    cg = fourier_consistency(plan, m, "l1", integer=False, engine_options={"column_generation": True})
    full = fourier_consistency(plan, m, "l1", integer=False, engine_options={"column_generation": False})
    assert cg.success and cg.reconstruction.info["initial"] == "interior"
    assert cg.reconstruction.fun == pytest.approx(full.reconstruction.fun, rel=1e-8)
    unused = np.asarray(plan.encoding.structural_zero_mask()).ravel()
    assert unused.any() and (cg.binary_table[unused] == 0).all()


def test_entropy_projects_a_non_positive_noisy_total_instead_of_clamping():
    from dpopt.estimate import reconstruct

    data = binary_data(5, 80, 21)
    plan = fourier_plan(data.domain, 2)
    m = exact_measurement(plan, data)
    values = np.array(m.values, dtype=float)
    values[plan.query.subsets.index(())] = -5.0  # a noise draw that left the total negative
    bad = Measurement(plan.query, values, "discrete_laplace", 1.0, 1.0, label="noisy")
    r = fourier_consistency(plan, bad, "entropy", integer=False)
    fit = reconstruct([bad], ConstraintSet(plan.domain, [NonNegativity()]), "l2")
    assert r.success and fit.success and fit.x.sum() > 1
    # The entropy table keeps the projected total as an equality of its cone program, which
    # Clarabel certifies to its primal feasibility tolerance tol_feas = 1e-8, relative to
    # 1 + the largest right-hand side (the coefficients); compare at that tolerance.
    certified = 1e-8 * (1.0 + np.abs(values).max())
    assert r.binary_table.sum() == pytest.approx(fit.x.sum(), rel=0, abs=certified)
    nothing = Measurement(plan.query, np.where(np.arange(values.size) == 0, -5.0, 0.0), "discrete_laplace", 1.0, 1.0)
    with pytest.raises(SolverError, match="positive total"):
        fourier_consistency(plan, nothing, "entropy", integer=False)


# ---- inputs --------------------------------------------------------------------------------------
def test_bad_inputs_raise_named_errors():
    data = binary_data(4, 50, 18)
    plan = fourier_plan(data.domain, 2)
    m = measure_fourier(plan, data, Accountant.pure(1), make_random(19))
    with pytest.raises(ParameterError, match="method"):
        fourier_consistency(plan, m, "lp")
    with pytest.raises(ParameterError, match="t must be"):
        fourier_consistency(plan, m, "shift", t=-1)
    with pytest.raises(QueryError, match="marginals\\[0\\]"):
        fourier_plan(data.domain, [("nope",)])
    with pytest.raises(QueryError, match="between 1 and"):
        fourier_plan(data.domain, 9)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        barak_release(data, 2)
    with pytest.raises(PrivacyParameterError, match="delta"):
        theorem5_bound(2, 10, 1.0, 1.5)
    with pytest.raises(DataError, match="domain"):
        measure_fourier(fourier_plan(mixed_data().domain, 1), data, Accountant.pure(1))
    other = FourierParity(plan.domain, downward_closure([("a0",)], plan.domain))
    with pytest.raises(QueryError, match="plan's unnormalised parities"):
        fourier_consistency(plan, Measurement.exact(other, other.answer(data)), "linf")
    inv = ConstraintSet(data.domain, [Invariant(Total(data.domain), [50.0], name="total")])
    with pytest.raises(ParameterError, match="invariants"):
        fourier_consistency(plan, m, "shift", inv)


def test_fourier_columns_match_dense_matrix():
    domain = Domain(tuple(f"a{i}" for i in range(7)), (2,) * 7)
    subsets = downward_closure([("a0", "a3", "a6"), ("a1", "a2")], domain)
    cells = np.array([5, 0, 127, 64, 3, 3])
    for normalized in (False, True):
        q = FourierParity(domain, subsets, normalized=normalized)
        np.testing.assert_array_equal(q.columns(cells).toarray(), q.to_dense()[:, cells])
    with pytest.raises(QueryError, match="cell numbers"):
        q.columns(np.array([128]))
