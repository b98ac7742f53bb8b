"""The smooth (entropy-regularised) estimate in marginal space, by message passing on a junction tree.

The dense smooth estimate (:mod:`dpopt.estimate.engines.smooth`) is ``K`` Bregman proximal steps

    x_k = argmin ½ Σ_i ((C x − y)_i / σ_i)² + λ D(x ‖ x_{k−1}),   x_0 = p,   1ᵀx = N̂ (held),

with ``λ = c / σ̄`` from the noise only. The optimum of each step is ``x(ν) = p_k ∘ exp(−Cᵀν / λ)``
at the maximiser ``ν`` of the concave dual

    g(ν) = λ (Σ p_k − Σ x(ν)) − νᵀd − ½ Σ_i σ_i² ν_i²

(one multiplier per measured marginal cell, and one for the held total, ``σ = 0``). When the
rows ``C`` are marginals, ``x(ν)`` is a *log-linear model* with one factor per measured set
(and per one-way factor of the prior, and ``x_{k−1}`` is one too): it is Markov on any junction
tree whose cliques hold those sets (:mod:`~dpopt.estimate.marginal_space.graphical.junction_tree`). So
``C x(ν)`` and ``Σ x(ν)`` come from sum-product on the cliques, the Newton products
``C diag(x) Cᵀ v`` from its forward-mode derivative, and this module computes **the same
estimate as the dense engine** (same ``λ``, ``K``, prior and held total; tested against it)
without the full table, whenever the junction tree's cliques fit in memory (``max_cells``,
checked before anything is allocated, with the largest clique named in a one-line
DomainError). Newton's method on the dual, conjugate gradients with the diagonal
``C x / λ + σ²`` as preconditioner (exact on each measured set's own block, so the
preconditioned condition number is at most the number of sets sharing a cell), the
line search and the stopping rule are the dense engine's.

**Certificate** (every step's last point; the release needs the last step's): the primal
``Φ_k(x) = ½ χ² + λ D(x ‖ x_{k−1})`` evaluated *from the clique marginals alone*, with
``D`` by the junction-tree decomposition ``Σ_C KL(μ_C‖π_C) − Σ_S KL(μ_S‖π_S) − Σx + Σp``
(``π`` the step prior's marginals), against the dual ``g(ν)`` from the multipliers: the relative
gap must be below :data:`~dpopt.estimate.certificates.verify.CERTIFICATE_TOL`, as must the held
total's residual and the stationarity ``max_i |r_i − σ_i² ν_i| / σ_i`` (the gradient of
``Φ_k`` is ``Cᵀ(r/σ² − ν)`` on the model). Nothing uncertified is released (``success`` False).

**Priors.** Every prior is a product ``p = N̂ Π_a p_a / N̂`` of one factor per attribute (so it
is Markov on the tree: a one-way factor on a clique holding ``a``), each factor either uniform,
``N̂/n_a``, or ``m_a``, the estimated one-way. ``m_a`` is post-processing of the noisy
measurements only: the inverse-variance average of every measured set's marginal on ``a`` (a set
``S`` gives variance ``σ_S² D_S / n_a`` per cell; ``s_a²`` the average's variance per cell),
projected onto ``{m ≥ f_a, Σ m = N̂}``, or uniform when ``n_a s_a ≥ N̂``. The floor is
``f_a = s_a`` (a count within one s.d. of zero says only that; the same floor as the dense
engine's prior total), which leaves each cell room for the steps to lift it where a larger
measured set shows it (each step multiplies the prior). When every measured set is one attribute
or none — one-way marginals and totals only, the pure-ε fallback of
:mod:`dpopt.strategy.wide_selection` — no measurement can show a cell above what the average
does, and the floor only spreads mass over cells the data put at zero: there ``f_a = s_a / √n_a``,
so the floors hold at most ``n_a f_a = √n_a s_a``, one s.d. of the one-way's total (issue 27,
session 9: on adult at pure ε 0.1, seed 7, the floor ``s_a`` ≈ 122 put 11,067 records in the 91
cells of capital-gain whose true count is below ``s_a``, which hold 577; mean L1/n over the 364
triples 0.418 → 0.398). Not per attribute: the lower floor on an attribute that only one-way
marginals hold *beside* selected sets lost on a generated 16-value attribute (zCDP ε 0.1, three
runs, +0.00007 to +0.00010, about 3 s.e.; docs, marginal space).

- ``"uniform"`` (the dense engine's default): every factor uniform.
- ``"one-way"``: every factor ``m_a`` (where a measured set holds ``a``).
- ``"per-attribute"`` (the default here): ``m_a`` for the attributes whose cells the steps
  cannot all resolve (rule (8)) and, with one-way marginals only, for those whose uniform
  factor's risk estimate is larger beyond its s.d. (rule (9)), uniform for the others (issue 27). Where every attribute is resolved it
  is the uniform prior, i.e. the dense engine's default.

**The per-attribute rule.** The dense engine's notes give the linearised filter of ``K``
proximal steps: a direction with data curvature ``f`` and penalty curvature ``κ'`` keeps the
fraction ``1 − (κ'/(f + κ'))^K`` of its least-squares fit, the rest staying at the prior. For a
cell of the one-way marginal on ``a`` with count ``x_j``, the data curvature is ``1/s_a²`` (the
precision of the one-way average) and the penalty's, ``λ D(x ‖ p)``, is ``λ/x_j``, so ``K`` steps
leave the fraction ``κ_j^K`` of the cell at its prior, with::

    κ_j  =  λ s_a² / (x_j + λ s_a²)                                                       (7)

A cell with ``κ_j^K > 1/2`` is *unresolved*: the prior decides more of it than the data do (the
default ``c`` puts the filter's half-way point at signal-to-noise ratio 1, the same place). With
``m_j`` (at least its floor ``f_a``) for ``x_j``, attribute ``a`` takes the factor ``m_a`` when::

    min_j m_j  <  λ s_a² (2^{1/K} − 1)                                                    (8)

and the uniform factor otherwise. With the default ``c = 1/(2^{1/K} − 1)`` the bound is
``s_a²/σ̄``; since ``m_j ≥ s_a``, only an attribute whose one-way is noisier than ``σ̄`` per
cell (``s_a > σ̄``: measured less precisely than the average row) can take its one-way; with
one-way marginals only (floor ``s_a / √n_a``), an attribute with a cell at the floor takes it
when ``s_a > σ̄ / √n_a`` (adult's fallback, seed 7: 11 of 14 attributes, 5 with the floor ``s_a``). Why: the
uniform prior puts ``N̂/n_a`` in an unresolved cell, so on a skewed many-valued attribute at
small ``ε`` its near-empty cells are lifted towards ``N̂/n_a`` and mass lands in empty cells
(the loss to Private-PGM found in issue 27); when every cell is resolved, the prior hardly moves
the one-way, and on binary attributes of large counts the uniform prior's mild shrinkage did
better than none (the one-way prior lost on binary networks at pure ``ε`` 0.1). Whole factors,
not cells: a rule that took ``m_j`` only in the unresolved cells lost on a 32-value domain where
the whole one-way won (docs, marginal space). The rule reads the noisy answers (through
``m_a``), their variances and ``λ`` (a function of the variances), never the data; 1/2 is the
filter's half-way point, not a fitted constant. ``info["prior_weights"]`` lists per attribute
1.0 (one-way) or 0.0 (uniform).

**The risk rule with one-way marginals only (9).** Rule (8)'s fraction ``κ_j^K`` depends on
``x_j / s_a``, not on how far the cell is from the prior: a resolved cell far from ``N̂/n_a``
still keeps ``κ_j^K`` of that distance as bias (adult at pure ε 0.1, seed 7: sex, 16,192 /
32,650 records, is resolved, and the uniform factor's fit is off by 742 records against the
one-way's 98). When every measured set is one attribute or none, the estimate is a product whose
factor on ``a`` is that attribute's own ``K`` proximal steps on ``n_a`` cells, solved in closed
form (Wright's omega) with its exact Jacobian in the noisy average
(:mod:`~dpopt.estimate.marginal_space.graphical.prior_risk`), so Stein's unbiased risk estimate
of each factor's fit, ``SURE = ‖f − ȳ‖² − n_a s_a² + 2 s_a² tr ∂f/∂ȳ``, is exact for Gaussian
noise. An attribute rule (8) leaves uniform takes its one-way when::

    SURE_uniform − SURE_one-way  >  s_a ‖∇_ȳ (‖f_u − ȳ‖² − ‖f_o − ȳ‖²)‖                  (9)

(the excess beyond one s.d. of its own estimate, delta method; the divergence term's own
variation is left out). Within one s.d. the sign of the excess follows the noise: on binary
d = 100 pairs (pure ε 0.1) choosing by its sign picked the worse factor for more attributes than
not. One direction only: where rule (8) takes the one-way (an unresolved cell), a smaller squared
error risk of the uniform factor does not overrule it, because squared error weighs mass spread
thinly over many near-empty cells far less than the L1 error does, and that spread is what rule
(8) guards against (letting (9) overrule it both ways lost on the 128-value fallback grid,
+0.0019, s.e. 0.0002 over 8 seeds). Noise from the Laplace mechanism makes (9) an approximation
(Stein's identity is Gaussian; the unbiasedness of the squared residual's mean is not).
Validation (issue 27, session 10; each seed one noise draw shared by the networks; mean over
seeds of the per-seed difference in mean L1/n over the scored marginals against rule (8), s.e.
over 8 seeds): adult pure ε 0.1 −0.0026; 128-value grid −0.0071; 32-value grid −0.0008;
binary d = 100 pairs +0.00005 (s.e. 0.00003, level). With a set of two attributes or more
measured, (9) does not apply and rule (8) decides alone.

**Scope.** Noisy marginals (and totals) only; public constraints other than non-negativity
(which the estimate keeps on every cell: it is positive) and public totals are refused with a
one-line error rather than ignored.
"""

from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from dpopt.errors import ParameterError, QueryError
from dpopt.estimate.certificates.verify import CERTIFICATE_TOL
from dpopt.estimate.engines.smooth import RTOL_FACTOR, STEPS, default_smoothing, dual_backtrack, dual_stalled
from dpopt.estimate.marginal_space.graphical.junction_tree import JunctionTree, elimination_cliques
from dpopt.estimate.marginal_space.graphical.prior_risk import risk_difference
from dpopt.estimate.marginal_space.layout import ResidualIndex, SetFamily, maximal_sets, measured_and_workload_axes
from dpopt.estimate.marginal_space.result import MarginalEstimate
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet

__all__ = ["estimate_smooth", "SMOOTH_PRIORS", "attribute_priors", "check_smooth_options", "read_cells", "tree_cells", "tree_sets"]

#: Newton residuals within this fraction of the largest target are rounding (about 500 ulp).
ROUNDING_FLOOR = 1e-13
#: Priors of the marginal-space smooth estimate (module notes).
SMOOTH_PRIORS = ("per-attribute", "uniform", "one-way")


class _Rows:
    """The measured rows ``C`` over the junction tree: marginals of the cliques, and factors back."""

    def __init__(self, tree: JunctionTree, axes: list[tuple[int, ...]], held: bool) -> None:
        self.tree = tree
        self.axes = axes
        self.holders = [tree.holder(a) for a in axes]
        self.shapes = [tuple(tree.sizes[i] for i in a) for a in axes]
        self.broadcast = [tree.broadcast_shape(h, a) for h, a in zip(self.holders, axes)]
        self.summed = [tree.summed_axes(h, a) for h, a in zip(self.holders, axes)]
        # The clique's axes with the set's first: one transposed copy summed along one axis is
        # several times faster than numpy's sum over many small axes (16 binary axes: 4.6×).
        self.transposed = [tuple(i for i in range(len(tree.cliques[h])) if i not in s) + s
                           for h, s in zip(self.holders, self.summed)]
        self.shared = np.bincount(np.asarray(self.holders, dtype=np.intp), minlength=len(tree.cliques)) > 1
        cells = [math.prod(s) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(cells)]).astype(np.int64)
        self.num_noisy = int(self.offsets[-1])
        self.held = held
        self.size = self.num_noisy + (1 if held else 0)

    def marginals(self, weighted: list[np.ndarray]) -> np.ndarray:
        """``C x`` from the clique arrays (clique marginals, or their derivatives)."""
        out = np.empty(self.size)
        for i, (h, s) in enumerate(zip(self.holders, self.summed)):
            cells = self.offsets[i + 1] - self.offsets[i]
            m = np.transpose(weighted[h], self.transposed[i]).reshape(cells, -1).sum(axis=1) if s else weighted[h]
            out[self.offsets[i]:self.offsets[i + 1]] = np.ravel(m)
        if self.held:
            out[-1] = float(weighted[self.tree.order[0]].sum())
        return out

    def factors(self, v: np.ndarray) -> list:
        """``Cᵀ v`` as one log-factor per clique (None where no row lands)."""
        f: list = [None] * len(self.tree.cliques)
        for i, (h, b) in enumerate(zip(self.holders, self.broadcast)):
            part = v[self.offsets[i]:self.offsets[i + 1]].reshape(b)
            if not self.shared[h]:
                f[h] = part
            else:  # several sets on one clique: one array, added into in place
                if f[h] is None:
                    f[h] = np.zeros(self.tree.shapes[h])
                f[h] += part
        if self.held:
            root = self.tree.order[0]
            f[root] = (np.zeros(self.tree.shapes[root]) if f[root] is None else f[root]) + v[-1]
        return f


def check_smooth_options(prior, steps, smoothing) -> None:
    """ParameterError naming the option when the prior, the number of proximal steps ``K`` or the
    smoothing constant ``c`` is not one the smooth estimate takes."""
    if prior not in SMOOTH_PRIORS:
        raise ParameterError(f"prior must be one of {', '.join(SMOOTH_PRIORS)}, got {prior!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ParameterError(f"steps must be a positive whole number, got steps={steps!r}")
    if smoothing is not None and not (np.isfinite(smoothing) and smoothing > 0):
        raise ParameterError(f"smoothing must be a positive number, got smoothing={smoothing!r}")


def estimate_smooth(measurements: Sequence, workload: Iterable[Sequence[str]] | None = None,
                    constraints: ConstraintSet | None = None, *, total: float | str = "auto",
                    prior: str = "per-attribute", steps: int = STEPS, smoothing: float | None = None,
                    tol: float = 1e-10, max_newton: int = 100, time_limit: float | None = None,
                    max_cells: int = 2**27, exact_cells: int = 0) -> MarginalEstimate:
    """The dense smooth estimate's workload marginals, computed on a junction tree (module notes).

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy answers to marginals, totals or the identity over one domain (Laplace or Gaussian,
        any accounting: each enters with weight ``1 / variance``).
    workload : iterable of attribute lists, optional
        The marginals to release (default: the measured sets); they join the junction tree.
    constraints : ConstraintSet, optional
        Only non-negativity (kept: the estimate is positive on every cell) and integrality
        (ignored, as by :func:`~dpopt.estimate.marginal_space.estimate_marginals`); others are refused.
    total : {"auto", "measured", "free"}
        ``"auto"`` and ``"measured"`` hold the total at ``N̂``, the measurements' inverse-variance
        total (at least its standard error), as the dense engine's ``total="estimate"``; ``"free"``
        lets each step decide it. A public count is refused (declare it as an invariant and use
        the least-squares estimate).
    prior : {"per-attribute", "uniform", "one-way"}
        The first step's prior (module notes, *Priors*): by default the estimated one-way for
        the attributes with a cell the steps cannot resolve (equation (8)) and, with one-way
        marginals only, for those whose uniform factor's risk estimate is larger beyond its
        s.d. (rule (9)), uniform for the others; every factor uniform (the dense engine's default); or every factor the one-way.
    steps : int
        ``K``, the proximal steps (default 3).
    smoothing : float, optional
        ``c`` in ``λ = c / σ̄`` (default ``1 / (2^{1/K} − 1)``).
    tol : float
        Newton stops when every row's dual residual is below ``tol`` (relative to its noise s.d.).
    max_newton : int
        Newton steps per proximal step.
    time_limit : float, optional
        Seconds for all the steps; reaching it gives TIME_LIMIT and no estimate.
    max_cells : int
        Refuse junction trees whose cliques hold more cells (DomainError naming the largest).
    exact_cells : int
        Domains of at most this many cells are solved as a table by the dense engine
        (``info["polytope"] == "table"``; the same estimate, and faster when one clique would
        hold the whole domain, as every triple of 16 attributes does). Default 0: always the
        junction tree (:func:`~dpopt.estimate.marginal_space.estimate_marginals` passes its own).

    Returns
    -------
    MarginalEstimate
        ``objective == "smooth"``; ``fun`` the measurements' ``χ²``; ``info`` holds ``lambda``,
        ``smoothing``, ``steps``, ``prior``, ``prior_weights`` (per attribute 1.0 for the one-way
        factor, 0.0 for the uniform one; None for the uniform prior), ``held_total``,
        ``prior_total``, ``newton_steps``,
        ``certificate`` (``gap``, ``stationarity``, ``total_residual``, ``primal``, ``dual``,
        ``ok``), ``polytope`` (``"junction tree"``), ``cliques``, ``clique_cells``,
        ``largest_clique_cells``, and ``read``: the workload sets no clique holds (``sets``), read
        off the tree by elimination (:meth:`JunctionTree.set_marginals`), the largest array that
        made (``largest_array_cells``, at most ``max_cells``: a larger one is refused before the
        solve with a DomainError naming the set) and the CPU seconds of planning and reading
        (``cpu_seconds``, of which ``plan_cpu_seconds``).
    """
    from dpopt.estimate.marginal_space.estimator import sets_and_domain

    start = time.perf_counter()
    measurements = list(measurements)
    sets, domain = sets_and_domain(measurements, "estimate_smooth")
    for m in measurements:
        if not float(m.variance) > 0:
            raise ParameterError(f"measurement {m.label!r} is exact (variance 0): the smooth marginal-space "
                                 "estimate takes noisy measurements only; use objective 'l2' for public counts")
    if constraints is not None:
        _check_constraints(constraints, domain)
    if isinstance(total, bool) or total not in ("auto", "measured", "free"):
        raise ParameterError(f"total must be 'auto', 'measured' or 'free' for the smooth estimate, got {total!r} "
                             "(a public count belongs in [constraints] invariants, with objective 'l2')")
    check_smooth_options(prior, steps, smoothing)
    if time_limit is not None and not (float(time_limit) > 0):
        raise ParameterError(f"time_limit must be positive seconds, got {time_limit!r}")

    axes, work = measured_and_workload_axes(domain, sets, workload, "estimate_smooth")
    sizes = [int(s) for s in domain.sizes]
    if exact_cells and domain.size <= exact_cells:
        return _smooth_table(measurements, constraints, domain, work, axes, total, prior, steps, smoothing, tol,
                             max_newton, time_limit, start)
    held_by_tree = tree_sets(len(domain), axes)
    loose = [s for s in held_by_tree if s not in axes]
    tree = JunctionTree(sizes, held_by_tree, max_cells, names=domain.attrs)
    # The released family: the tree's cliques and the workload sets (read off the tree when no
    # clique holds them), all marginals of the one model, hence consistent. Their reading plans
    # come from the tree alone: one too large is refused here, before any work.
    held_sets = maximal_sets(list(tree.cliques) + work)
    tick = time.process_time()
    plans = tree.read_plans([s for s in held_sets if s not in tree.cliques], names=domain.attrs)
    planned = time.process_time() - tick

    # The measurements' total and λ (the dense engine's formulas).
    values = [np.asarray(m.values, dtype=np.float64) for m in measurements]
    variances = np.array([float(m.variance) for m in measurements])
    rows_per = np.array([v.size for v in values], dtype=np.float64)
    weights = 1.0 / (variances * rows_per)
    n_hat = float(np.sum(weights * np.array([v.sum() for v in values])) / weights.sum())
    n_se = float(1.0 / np.sqrt(weights.sum()))
    if not max(n_hat, n_se) > 0:
        raise ParameterError(f"the smooth estimate needs a positive total, the measurements imply {n_hat:g}")
    prior_total = max(n_hat, n_se)
    c = default_smoothing(steps) if smoothing is None else float(smoothing)
    lam = c * float(np.sqrt(np.sum(rows_per / variances) / rows_per.sum()))
    held = total != "free"

    rows = _Rows(tree, axes, held)
    targets = np.concatenate([v.ravel() for v in values] + ([np.array([prior_total])] if held else []))
    var = np.concatenate([np.full(v.size, s) for v, s in zip(values, variances)] + ([np.zeros(1)] if held else []))
    base, prior_weights = _prior_factors(tree, prior, prior_total, axes, values, variances, sizes, lam, steps)

    info = {"lambda": lam, "smoothing": c, "steps": int(steps), "prior": prior, "prior_weights": prior_weights,
            "held_total": prior_total if held else None, "prior_total": prior_total, "newton_steps": 0,
            "polytope": "junction tree", "cliques": len(tree.cliques), "clique_cells": tree.cells,
            "largest_clique_cells": max(math.prod(s) for s in tree.shapes),
            "loose_attributes": [domain.attrs[a] for (a,) in loose],
            "total": {"mode": total, "held": held, "value": prior_total if held else None, "measured": n_hat,
                      "stddev": n_se, "predicted_bias": None, "rule": "the smooth estimate holds N̂ unless 'free'",
                      "reason": (f"held at the measured N̂ = {prior_total:.6g} (standard error {n_se:.3g}), as the "
                                 "dense smooth engine does" if held else "left free (total='free')")}}
    theta = np.zeros(rows.size)  # Σ of the previous steps' ν / λ: log x_{k−1} = log p − Cᵀθ
    status, message, certificate, mu = Status.NUMERICAL_ERROR, "no step taken", None, None
    point = theta  # the natural parameters of the last point (the estimate, or the incumbent)
    for done in range(1, steps + 1):
        remaining = None if time_limit is None else float(time_limit) - (time.perf_counter() - start)
        nu, mu, certificate, used, status, message = _proximal_step(
            tree, rows, base, theta, targets, var, lam, tol, max_newton, remaining)
        info["newton_steps"] += used
        point = theta + nu / lam
        if status is not Status.OPTIMAL or not certificate["ok"]:
            if status is Status.OPTIMAL:
                status = Status.NUMERICAL_ERROR
                message += (f"; dpopt's certificate failed: gap {certificate['gap']:.1e}, stationarity "
                            f"{certificate['stationarity']:.1e}, total {certificate['total_residual']:.1e}")
            break
        theta = point
    if steps > 1:
        message = f"proximal step {done} of {steps}: {message}"
    info["certificate"] = certificate
    ok = status is Status.OPTIMAL
    if ok:
        message += (f"; certified: relative duality gap {certificate['gap']:.1e}, stationarity "
                    f"{certificate['stationarity']:.1e} (tolerance {CERTIFICATE_TOL:g}); junction tree of "
                    f"{len(tree.cliques)} cliques, {tree.cells:,} cells")
    index = ResidualIndex(domain, held_sets)
    family = SetFamily(index, held_sets)
    if mu is not None and all(np.isfinite(m).all() for m in mu):
        deadline = None if time_limit is None else start + float(time_limit)
        tick = time.process_time()
        read = tree.set_marginals(mu, plans, deadline)
        info["read"] = {"sets": len(plans), "largest_array_cells": max((p.largest for p in plans), default=0),
                        "cpu_seconds": planned + time.process_time() - tick, "plan_cpu_seconds": planned}
        if read is None:  # the workload's marginals outside the cliques could not all be read in time
            ok, status = False, Status.TIME_LIMIT
            message += "; time limit while reading the workload's marginals outside the tree: nothing to release"
            read = {s: np.zeros([sizes[a] for a in s]) for s in held_sets if s not in tree.cliques}
        read.update(zip(tree.cliques, mu))
        # popped into the packed copy and divided in place: on adult's 364 triples (20.9 M cells)
        # each full-size temporary is 160 MB of the peak
        cells = family.pack([read.pop(s).ravel() for s in held_sets])
        residuals = family.adjoint(cells)
        residuals /= index.per_set(family.diagonal())
        fit = rows.marginals(mu)[: rows.num_noisy] - targets[: rows.num_noisy]
        chi2 = float(np.sum(fit**2 / var[: rows.num_noisy]))
        info["chi2"] = chi2
        info["smallest_clique_cell"] = float(min(m.min() for m in mu))
        total_value = float(mu[tree.order[0]].sum())
    else:
        cells, residuals, chi2, total_value = np.zeros(family.size), np.zeros(index.size), None, float("nan")
    return MarginalEstimate(
        status=status, success=ok, message=message, fun=chi2, objective="smooth", backend="marginal_space",
        solver="Newton's method on the dual (conjugate gradients), marginals by junction-tree message passing",
        domain=domain, workload=tuple(tuple(domain.attrs[a] for a in w) for w in work),
        cliques=tuple(tuple(domain.attrs[a] for a in c) for c in held_sets), index=index, family=family,
        residuals=residuals, clique_marginals=cells, total=total_value, table=None, measurements=measurements,
        constraints=constraints, nit=info["newton_steps"], time=time.perf_counter() - start, incumbent=not ok,
        info=info, residual_weights=None)


def tree_sets(num_attrs: int, measured_axes) -> list[tuple[int, ...]]:
    """The sets the junction tree must hold: every measured set, and alone every attribute that no
    measured set holds (uniform and independent of the rest in the estimate). Workload sets are
    read off the tree (:meth:`~dpopt.estimate.marginal_space.graphical.junction_tree.JunctionTree.set_marginals`),
    so they do not enlarge it."""
    held = {a for s in measured_axes for a in s}
    return [a for a in measured_axes if a] + [(a,) for a in range(num_attrs) if a not in held]


def tree_cells(sizes, measured_axes, work, limit: int | None = None) -> tuple[int, tuple[int, ...], int | None]:
    """``(cells, largest, reads)`` of the junction tree :func:`estimate_smooth` builds, from public
    quantities only (the measured sets and the domain's sizes): the cells over its cliques, its
    largest clique, and the cells one Newton product reads — the tree's, plus for each measured
    set the cells of the clique holding it (its marginal is summed out of that clique's array, and
    its factor added back in; several sets on one clique multiply that clique's cost). Above
    ``limit`` the count stops early: ``cells`` is then a number above ``limit``, not the tree's
    size, and ``reads`` is None."""
    cliques = elimination_cliques([int(n) for n in sizes], tree_sets(len(sizes), measured_axes), limit)
    cells = [math.prod(int(sizes[a]) for a in c) for c in cliques]
    largest = cliques[int(np.argmax(cells))] if cliques else ()
    total = int(sum(cells))
    if limit is not None and total > limit:
        return total, largest, None
    held = [set(c) for c in cliques]
    reads = total + sum(cells[next(i for i, c in enumerate(held) if set(s) <= c)] for s in measured_axes if s)
    return total, largest, int(reads)


def read_cells(sizes, measured_axes, work, limit: int | None = None) -> tuple[int, tuple[int, ...]]:
    """``(cells, axes)``: the largest array :func:`estimate_smooth` makes to read a workload set no
    clique holds off its junction tree (:meth:`JunctionTree.read_plans`), and that set; ``(0, ())``
    when every workload set is in a clique. Public quantities only (the measured sets, the
    workload, the domain's sizes), so a plan can refuse a read above ``max_cells`` before any
    measurement; call it once :func:`tree_cells` has found the tree small (nothing is allocated).

    Every array of a read lies on a clique's axes and the set's, so the largest clique's cells
    times the largest set's bound it: when that bound is within ``limit`` it is returned, with
    ``axes`` empty, without planning the reads (4,950 pairs of 100 attributes: 0.3 CPU s saved)."""
    sizes = [int(n) for n in sizes]
    held_by_tree = tree_sets(len(sizes), measured_axes)
    if limit is not None:
        clique = max((math.prod(sizes[a] for a in c) for c in elimination_cliques(sizes, held_by_tree)), default=1)
        bound = clique * max((math.prod(sizes[a] for a in w) for w in work), default=1)
        if bound <= limit:
            return bound, ()
    tree = JunctionTree(sizes, held_by_tree, 2**62)
    held = maximal_sets(list(tree.cliques) + [tuple(w) for w in work])
    plans = tree.read_plans([s for s in held if s not in tree.cliques], limit=2**62)
    worst = max(plans, key=lambda p: p.largest, default=None)
    return (0, ()) if worst is None else (int(worst.largest), worst.axes)


def _smooth_table(measurements, constraints, domain, work, axes, total, prior, steps, smoothing, tol, max_newton,
                  time_limit, start) -> MarginalEstimate:
    """The dense engine on the table (same options; a product prior as its table), and
    the workload's marginals read off it, as a :class:`MarginalEstimate`."""
    from dpopt.estimate import reconstruct
    from dpopt.estimate.engines.smooth import prior_total, smooth_weight
    from dpopt.estimate.problem import ConsistencyProblem
    from dpopt.model.constraints import NonNegativity
    from dpopt.model.queries.marginal import Marginal

    cs = ConstraintSet(domain, [NonNegativity()])
    table_prior, weights = None, None
    if prior != "uniform":
        sizes = [int(s) for s in domain.sizes]
        values = [np.asarray(m.values, dtype=np.float64) for m in measurements]
        variances = [float(m.variance) for m in measurements]
        problem = ConsistencyProblem(measurements, cs)
        n = prior_total(problem)
        lam = smooth_weight(problem, default_smoothing(steps) if smoothing is None else float(smoothing))
        factors = attribute_priors(prior, n, axes, values, variances, sizes, lam, steps)
        weights = [b for _, b in factors]
        table_prior = np.full(1, n)
        for p, _ in factors:  # C order over the attributes: the table's layout
            table_prior = np.multiply.outer(table_prior, p / n).ravel()
    result = reconstruct(measurements, cs, "smooth", steps=steps, smoothing=smoothing, prior=table_prior,
                         total="free" if total == "free" else "estimate", tol=tol, max_steps=max_newton,
                         time_limit=time_limit, integer=False)
    held_sets = maximal_sets(work)
    index = ResidualIndex(domain, held_sets)
    family = SetFamily(index, held_sets)
    x = np.zeros(domain.size) if result.x is None else np.asarray(result.x, dtype=np.float64)
    cells = family.pack([Marginal(domain, [domain.attrs[a] for a in s]).matvec(x) for s in held_sets])
    residuals = family.adjoint(cells) / index.per_set(family.diagonal())
    dense = result.info
    held = dense.get("held_total")
    info = {"lambda": dense.get("lambda"), "smoothing": dense.get("smoothing"), "steps": int(steps), "prior": prior,
            "prior_weights": weights, "held_total": held, "prior_total": dense.get("prior_total"),
            "newton_steps": result.nit,
            "polytope": "table", "cliques": len(held_sets), "clique_cells": int(family.size),
            "largest_clique_cells": int(domain.size), "chi2": dense.get("chi2"),
            "certificate": {"dense": True, "gap": dense.get("duality_gap"), "stationarity": dense.get("stationarity"),
                            "total_residual": dense.get("invariant_residual"), "ok": bool(result.success)},
            "total": {"mode": total, "held": held is not None, "value": held, "measured": None, "stddev": None,
                      "predicted_bias": None, "rule": "the smooth estimate holds N̂ unless 'free'",
                      "reason": "held at the measured N̂, as the dense smooth engine does" if held is not None
                      else "left free (total='free')"}}
    message = f"the full table ({domain.size:,} cells) fits: solved densely (smooth): {result.message}"
    return MarginalEstimate(
        status=result.status, success=bool(result.success), message=message, fun=dense.get("chi2"),
        objective="smooth", backend="marginal_space", solver="dpopt.estimate.reconstruct (smooth, newton)",
        domain=domain, workload=tuple(tuple(domain.attrs[a] for a in w) for w in work),
        cliques=tuple(tuple(domain.attrs[a] for a in c) for c in held_sets), index=index, family=family,
        residuals=residuals, clique_marginals=cells, total=float(x.sum()), table=None if result.x is None else x,
        measurements=measurements, constraints=constraints, nit=result.nit, time=time.perf_counter() - start,
        incumbent=not result.success, info=info, residual_weights=None)


def _check_constraints(constraints: ConstraintSet, domain) -> None:
    if not isinstance(constraints, ConstraintSet):
        raise ParameterError(f"constraints must be a ConstraintSet, got {type(constraints).__name__}")
    if constraints.domain != domain:
        raise QueryError(f"constraints are over {constraints.domain}, not the measurements' {domain}")
    if constraints.inequalities or constraints.invariants or list(constraints.zero_patterns()):
        raise ParameterError("the smooth marginal-space estimate keeps non-negativity only, not invariants, "
                             "structural zeros or inequalities; use objective 'l2'")


def _prior_factors(tree: JunctionTree, prior: str, total: float, axes, values, variances, sizes, lam: float,
                   steps: int) -> tuple[list, list | None]:
    """The first prior's log factor on each clique: ``log N̂ − Σ_a log n_a`` on the root (uniform),
    or ``log N̂ + Σ_a log(p_a / N̂)`` with each attribute's factor :func:`attribute_priors` on a
    clique holding it (module notes)."""
    factors = [np.zeros(s) for s in tree.shapes]
    root = tree.order[0]
    if prior == "uniform":
        factors[root] += math.log(total) - sum(math.log(n) for n in sizes)
        return factors, None
    factors[root] += math.log(total)
    parts = attribute_priors(prior, total, axes, values, variances, sizes, lam, steps)
    for a, (p, _) in enumerate(parts):
        h = tree.holder((a,))
        factors[h] = factors[h] + np.log(p / total).reshape(tree.broadcast_shape(h, (a,)))
    return factors, [b for _, b in parts]


def attribute_priors(prior: str, total: float, axes, values, variances, sizes, lam: float,
                     steps: int) -> list[tuple[np.ndarray, float]]:
    """Each attribute's factor ``p_a`` of a product prior ``N̂ Π_a p_a / N̂`` (module notes, *Priors*).

    Reads the noisy answers, their variances, the measured sets, the domain's sizes and ``λ``
    (a function of the variances) only: post-processing.

    Parameters
    ----------
    prior : {"uniform", "one-way", "per-attribute"}
        Each factor uniform; the estimated one-way ``m_a`` (where a measured set holds ``a``); or
        ``m_a`` exactly when some cell has ``m_j < λ s_a² (2^{1/K} − 1)`` (equation (8) of the
        module notes) or, when every measured set is one attribute or none, when the uniform
        factor's Stein risk exceeds the one-way's by more than one s.d. (rule (9)), else uniform.
    total : float
        ``N̂``, the prior's total.
    axes, values, variances, sizes
        The measured sets (attribute positions), their noisy answers and noise variances, and
        the domain's sizes.
    lam : float
        ``λ``, the smoothing weight.
    steps : int
        ``K``, the proximal steps.

    Returns
    -------
    list of (ndarray, float)
        Per attribute, ``p_a`` (positive, summing to ``total``) and 1.0 when it is the one-way,
        0.0 when uniform.
    """
    out = []
    one_ways_only = all(len(s) <= 1 for s in axes)
    for a, n in enumerate(sizes):
        uniform = np.full(n, total / n)
        mean, weight = _one_way_average(a, n, axes, values, variances, sizes)
        if prior == "uniform" or weight == 0 or n == 1:
            out.append((uniform, 0.0))
            continue
        m, floor = _project_one_way(mean, weight, total, one_ways_only)
        if prior == "one-way":
            out.append((m, 1.0))
            continue
        take = _unresolved(m, weight, lam, steps)
        if one_ways_only and not take:
            # rule (9): with one-way marginals only, also the one-way where the uniform factor's
            # Stein risk exceeds the one-way factor's by more than one s.d. of that estimate
            excess, sd = risk_difference(mean, 1.0 / weight, lam, steps, total, m, floor)
            take = bool(excess > sd)
        out.append((m, 1.0) if take else (uniform, 0.0))
    return out


def _one_way_average(a: int, n: int, axes, values, variances, sizes) -> tuple[np.ndarray, float]:
    """The inverse-variance average of every measured set's sums onto attribute ``a`` and its
    precision per cell (``(zeros, 0)`` when no measured set holds ``a``)."""
    sums, weights = np.zeros(n), 0.0
    for s, y, v in zip(axes, values, variances):
        if a not in s:
            continue
        shape = [sizes[b] for b in s]
        other = tuple(i for i, b in enumerate(s) if b != a)
        cells = math.prod(shape)
        w = 1.0 / (v * cells / n)  # per cell of the one-way
        sums += w * (y.reshape(shape).sum(axis=other) if other else y)
        weights += w
    return (sums / weights if weights else sums), weights


def _one_way(a: int, n: int, total: float, axes, values, variances, sizes) -> np.ndarray:
    """The estimated one-way marginal on attribute ``a``, positive, summing to ``total``: the
    inverse-variance average projected onto ``{m ≥ f_a, Σ m = N̂}``, with ``f_a = s_a / √n_a`` when
    every measured set is one attribute or none (one-way marginals and totals) and ``f_a = s_a``
    otherwise; uniform when ``n_a s_a ≥ N̂`` (module notes, *Priors*)."""
    mean, weights = _one_way_average(a, n, axes, values, variances, sizes)
    if weights == 0:
        return np.full(n, total / n)
    return _project_one_way(mean, weights, total, all(len(s) <= 1 for s in axes))[0]


def _project_one_way(mean: np.ndarray, weights: float, total: float, one_ways_only: bool) -> tuple[np.ndarray, float]:
    """``m_a`` from the inverse-variance average ``mean`` and its precision per cell ``weights`` (> 0),
    and its floor ``f_a``: ``f_a = s_a / √n_a`` when ``one_ways_only`` (every measured set is one
    attribute or none), ``s_a`` otherwise; ``m_a`` uniform when ``n_a s_a ≥ N̂``."""
    n = mean.size
    sd = 1.0 / math.sqrt(weights)
    # One-way marginals alone cannot show a cell above what the average does: a floor there only
    # spreads mass, so the floors hold one s.d. of the total, √n_a s_a (module notes, *Priors*).
    floor = sd / math.sqrt(n) if one_ways_only else sd
    if n * sd >= total:
        return np.full(n, total / n), floor
    return floor + _simplex(mean - floor, total - n * floor), floor


def _unresolved(m: np.ndarray, weights: float, lam: float, steps: int) -> bool:
    """Equation (8): some cell of ``m_a`` below ``λ s_a² (2^{1/K} − 1)``, where the uniform prior's
    ``K`` steps would leave it more than half at the prior (``κ_j^K > 1/2``)."""
    return float(m.min()) < lam / weights * (2.0 ** (1.0 / steps) - 1.0)


def _simplex(v: np.ndarray, mass: float) -> np.ndarray:
    """Euclidean projection of ``v`` onto ``{w ≥ 0, Σ w = mass}`` (sort-based; Held, Wolfe and
    Crowder 1974)."""
    u = np.sort(v)[::-1]
    cumulative = np.cumsum(u) - mass
    k = np.arange(1, v.size + 1)
    rho = np.flatnonzero(u - cumulative / k > 0)[-1]
    return np.maximum(v - cumulative[rho] / (rho + 1), 0.0)


def _proximal_step(tree, rows: _Rows, base, theta, d, var, lam, tol, max_newton, time_limit):
    """One step by Newton's method on the dual, then its certificate:
    ``(ν, μ, certificate, Newton steps, status, message)``."""
    start = time.perf_counter()
    offset = rows.factors(-theta)
    log_prior = [b if o is None else b + o for b, o in zip(base, offset)]

    def evaluate(nu):
        shift = rows.factors(-nu / lam)
        mu, mu_sep, log_z = tree.calibrate([lp if s is None else lp + s for lp, s in zip(log_prior, shift)])
        return mu, mu_sep, math.exp(log_z) if log_z < 700 else math.inf

    nu = np.zeros(d.size)
    prior_mu, prior_sep, prior_mass = evaluate(nu)
    mu, mu_sep, mass = prior_mu, prior_sep, prior_mass
    largest = max(float(np.abs(d).max(initial=0.0)), 1e-300)
    row_scale = np.where(var > 0, np.sqrt(var), np.maximum(np.abs(d), 1e-3 * largest))
    # Marginal sums carry rounding errors of some 1e-16 of the largest count: with near-exact noise
    # (σ = 0.1 on counts of 10^4) tol·σ is below them, so residuals within ROUNDING_FLOOR of the
    # largest target count as zero (the certificate still judges the point).
    slack = ROUNDING_FLOOR * largest

    def dual(nu, mass):
        return float(lam * (prior_mass - mass) - nu @ d - 0.5 * np.sum(var * nu * nu))

    value = dual(nu, mass)
    cx = rows.marginals(mu)
    gradient = cx - d - var * nu
    status, message = Status.ITERATION_LIMIT, f"Newton's method stopped after {max_newton} steps"
    steps = 0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for steps in range(max_newton + 1):
            worst = float(np.max(np.abs(gradient) / row_scale, initial=0.0))
            if worst <= tol or float(np.max((np.abs(gradient) - slack) / row_scale, initial=0.0)) <= tol:
                status, message = Status.OPTIMAL, f"Newton's method on the dual converged in {steps} steps"
                break
            if steps == max_newton:
                break
            if time_limit is not None and time.perf_counter() - start > time_limit:
                status, message = Status.TIME_LIMIT, f"time limit after {steps} Newton steps"
                break
            diag = cx / lam + var
            diag = np.where(diag > 0, diag, 1.0)
            m = d.size
            hess = LinearOperator(
                (m, m), dtype=np.float64,
                matvec=lambda v, mu=mu, mu_sep=mu_sep: rows.marginals(tree.tangent(mu, mu_sep, rows.factors(v)))
                / lam + var * v)
            precond = LinearOperator((m, m), matvec=lambda v, diag=diag: v / diag, dtype=np.float64)
            direction, _ = cg(hess, gradient, rtol=min(0.5, max(1e-10, np.sqrt(worst) * RTOL_FACTOR)), maxiter=500,
                              M=precond)
            slope = float(gradient @ direction)
            norm = float(np.linalg.norm(gradient / row_scale))

            def trial(trial_nu):
                trial_mu, trial_sep, trial_mass = evaluate(trial_nu)
                trial_cx = rows.marginals(trial_mu)
                return (dual(trial_nu, trial_mass), trial_cx - d - var * trial_nu,
                        (trial_mu, trial_sep, trial_mass, trial_cx))

            step = dual_backtrack(nu, direction, value, slope, norm, row_scale, trial, finite_gradient=True)
            if step is None:
                status, message = dual_stalled(steps, worst, tol)
                break
            nu, value, gradient, (mu, mu_sep, mass, cx) = step
    certificate = _certificate(tree, rows, mu, mu_sep, prior_mu, prior_sep, prior_mass, mass, nu, cx, d, var, lam,
                               value)
    return nu, mu, certificate, steps, status, message


def _certificate(tree, rows: _Rows, mu, mu_sep, prior_mu, prior_sep, prior_mass, mass, nu, cx, d, var, lam,
                 dual_value) -> dict:
    """The primal from the clique marginals (KL by the junction-tree decomposition), against the dual."""
    k = rows.num_noisy
    r = cx[:k] - d[:k]
    chi2 = float(np.sum(r**2 / var[:k]))
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = sum(float(np.sum(m * (np.log(m) - np.log(p)))) for m, p in zip(mu, prior_mu))
        for c in tree.order[1:]:
            kl -= float(np.sum(mu_sep[c] * (np.log(mu_sep[c]) - np.log(prior_sep[c]))))
    divergence = kl - mass + prior_mass
    primal = 0.5 * chi2 + lam * divergence
    gap = (primal - dual_value) / (1.0 + abs(primal) + abs(dual_value))
    stationarity = float(np.max(np.abs(r - var[:k] * nu[:k]) / np.sqrt(var[:k]), initial=0.0))
    total_residual = abs(cx[-1] - d[-1]) / max(1.0, abs(d[-1])) if rows.held else 0.0
    ok = bool(np.isfinite(primal) and max(abs(gap), stationarity, total_residual) <= CERTIFICATE_TOL)
    return {"gap": float(gap), "stationarity": stationarity, "total_residual": float(total_residual),
            "primal": float(primal), "dual": float(dual_value), "kl_to_previous": float(divergence), "chi2": chi2,
            "ok": ok}
