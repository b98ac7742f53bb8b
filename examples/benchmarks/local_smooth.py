"""The local smooth estimate: least squares plus clique-wise entropy, in residual coordinates.

A prototype for large cyclic families (issue 27; a benchmark module, not a code path: see
bench_local_smooth.py for why it was not wired), where the junction tree of
:mod:`~dpopt.estimate.marginal_space.graphical.smooth` is the whole domain and the least-squares
projection (:mod:`.projection`, problem (4)) has not certified. In the residual coordinates ``r``
of :mod:`~dpopt.estimate.marginal_space.layout` (consistency of overlapping marginals is then
automatic) each proximal step ``k = 1..K`` solves the *unconstrained*, strictly convex problem

    f_k(r) = ½ Σ_A W_A ||r_A − r̂_A||²  +  λ Σ_C w_C KL(μ_C(r) ‖ π_C^{(k)}),   μ = E r        (L1)

with ``KL(μ‖π) = Σ μ log(μ/π) − μ + π`` (generalised), ``r̂, W`` the residual least squares of
:mod:`~dpopt.estimate.marginal_space.gls` (equation (3)), ``π^{(1)}`` the smooth estimate's
product prior (:func:`~dpopt.estimate.marginal_space.graphical.smooth.attribute_priors`) and
``π^{(k)} = μ^{(k−1)}``: the Bregman proximal steps of the smooth estimate with its joint
``D(x ‖ x_{k−1})`` replaced by the sum of the cliques' divergences (a convex "free energy" with
counting number ``w_C`` on every clique and none on their intersections: McKenna, Sheldon,
Miklau 2021, "Relaxed marginal consistency for differentially private query answering", and
Heskes 2006 on convex free energies). The entropy is a barrier: ``μ → 0`` sends the gradient to
``−∞``, so the optimum is strictly positive and non-negativity needs no constraint.

**Weights.** At ``μ_C = π_C`` uniform, the Hessian of ``KL(μ_C ‖ π_C)`` on a residual ``A ⊆ C``
is ``n_A / N`` per coordinate, whatever ``C``: the same as the joint divergence's curvature on
that residual. With ``w_C = 1`` the top residuals (in one clique) get the joint's curvature
exactly and a residual in ``N_A`` cliques gets ``N_A`` times it; when every clique is measured
with one noise scale the data weight ``W_A`` grows by the same factor ``N_A``, so every residual
keeps the ratio of penalty to data that a single clique measured alone would have.
Matching the joint on every order (Kikuchi counting numbers) is not convex on these families.
``counting="conditional"`` subtracts from every clique ``C`` of ``k`` attributes ``1/k`` of the
divergence of each ``(k−1)``-subset: ``KL_C − (1/k) Σ_S KL_S`` is an average of conditional
divergences, hence convex, and removes the overlap's curvature down to the floor of such averages for
clique-local terms (on every triple of ``d`` attributes a one-way keeps ``C(d−1,2)/3`` of the
joint's curvature instead of ``C(d−1,2)``, a pair ``(d−2)·2/3`` instead of ``d−2``, the total none).

**λ** is the smooth estimate's: ``c / σ̄`` with ``c = 1 / (2^{1/K} − 1)`` and ``K = 3`` steps
(:func:`dpopt.estimate.engines.smooth.default_smoothing`), so that ``K`` steps keep half the fit
of a direction at signal-to-noise ratio 1, as there.

**Solver.** Newton's method on the free residuals: conjugate gradients on
``H v = W v + λ Eᵀ diag(w/μ) E v`` (one expand and one adjoint per product), preconditioned by
the exact diagonal ``W + λ (E∘E)ᵀ (w/μ)`` (the per-axis transforms squared:
:func:`squared_adjoint`), then a backtracking line search on ``f_k`` along which ``μ`` stays
positive (the step is cut at 99 % of the distance to the first vanishing cell; ``E d`` is
computed once per step, so the search costs no product).

**Certificate.** ``f_k`` is ``W``-strongly convex on the free residuals (the entropy term is
convex), so ``f_k(r) − f_k* ≤ ½ gᵀ W⁻¹ g`` with ``g`` the gradient: the release requires
``½ gᵀ W⁻¹ g / (1 + |f_k|) ≤ tol`` (:data:`~dpopt.estimate.certificates.verify.CERTIFICATE_TOL`)
at every step's point and ``μ > 0`` on every clique cell. Residuals no measurement covers get
the least-squares estimator's weak quadratic prior (its step 3) so that ``W > 0`` everywhere.
Fixed residuals (exact measurements, invariants, the held total) stay fixed.

Pure post-processing: reads the noisy answers, their variances and public sizes only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np

from dpopt.estimate.certificates.verify import CERTIFICATE_TOL
from dpopt.estimate.marginal_space.layout import SetFamily, _fibres, _scales

__all__ = ["estimate_local_smooth", "LocalSmoothProblem", "LocalSmoothSolution", "solve_local_smooth",
           "squared_adjoint", "clique_diagonals", "CliqueBlockPreconditioner", "clique_log_prior", "STEP_FRACTION"]

#: A line-search step stops at this fraction of the distance to the first clique cell reaching zero.
STEP_FRACTION = 0.99


# ---- the exact diagonal of Eᵀ diag(s) E ------------------------------------------------------
def _squared_analyse_axis(v: np.ndarray, axis: int) -> np.ndarray:
    """``(U_a ∘ U_a)ᵀ`` along ``axis``: entry 0 is ``Σ v / n²``, entry ``i ≥ 1`` is
    ``s_i² (Σ_{j<i} v_j + i² v_i)`` (the squared Helmert columns of layout's ``U_a``)."""
    f = _fibres(v, axis)
    n = f.shape[1]
    out = np.empty_like(f)
    out[:, 0, :] = f.sum(axis=1) / (n * n)
    head = np.cumsum(f, axis=1)[:, :-1, :]
    i = np.arange(1, n, dtype=np.float64)[None, :, None]
    out[:, 1:, :] = (head + i * i * f[:, 1:, :]) * (_scales(n) ** 2)[None, :, None]
    return out.reshape(v.shape)


def squared_adjoint(family, cells: np.ndarray) -> np.ndarray:
    """``(E ∘ E)ᵀ s``: the diagonal of ``Eᵀ diag(s) E`` (length ``index.size``), for ``s`` over the
    family's cells. Every residual coordinate is one entry of a clique's tensor, whose column of
    ``E`` is the Kronecker product of one column of each ``U_a``: its squares are the Kronecker
    product of the squared columns, so the transposed squared transforms give the diagonal."""
    if isinstance(family, StackedFamily):
        first, second = family.parts
        return squared_adjoint(first, cells[:first.size]) + squared_adjoint(second, cells[first.size:])
    return np.bincount(family._indices(), weights=clique_diagonals(family, cells), minlength=family.index.size)


def clique_diagonals(family: SetFamily, cells: np.ndarray) -> np.ndarray:
    """Per clique, the diagonal of ``E_Cᵀ diag(s_C) E_C`` on the clique's own residual slots (flat
    cell layout: slot ``j`` of clique ``C`` is the residual entry its tensor holds at cell ``j``);
    :func:`squared_adjoint` sums them over the cliques."""
    transformed = np.empty(family.size)
    for g in family.groups:
        v = family.view(cells, g)
        if g.dense is not None:
            out = v.reshape(len(g.axes), -1) @ (g.dense * g.dense)
        else:
            out = v
            for axis in range(len(g.sizes)):
                out = _squared_analyse_axis(out, axis + 1)
        family.view(transformed, g)[...] = out.reshape(v.shape)
    return transformed


# ---- the per-clique block preconditioner -------------------------------------------------------
def complement_sizes(family: SetFamily) -> np.ndarray:
    """``n_{C∖A}`` on every slot (flat cell layout): the size of the axes on which the slot's tensor
    index is 0, i.e. the clique's attributes outside the slot's residual set ``A``."""
    out = np.empty(family.size)
    for g in family.groups:
        k = len(g.sizes)
        grid = np.indices(g.sizes).reshape(k, -1) if k else np.zeros((0, 1), dtype=np.int64)
        rest = np.prod(np.where(grid == 0, np.asarray(g.sizes)[:, None], 1), axis=0).astype(np.float64)
        family.view(out, g)[...] = rest.reshape(g.sizes)[None]
    return out


class CliqueBlockPreconditioner:
    """Stiffness-weighted additive Schwarz over the cliques for ``H = W + λ Eᵀ diag(w/μ) E``.

    With every clique measured once, ``W = Σ_C E_Cᵀ E_C / σ_C²`` exactly (the parts of (1) are
    orthogonal, so ``Σ_C E_Cᵀ E_C / σ_C²`` is the diagonal ``W_A = Σ_{C ⊇ A} 1 / (σ_C² n_{C∖A})``
    of gls.py), hence ``H ≈ Σ_C R_Cᵀ B_C R_C`` with the element matrices
    ``B_C = E_Cᵀ D_C E_C``, ``D_C = δ_C + λ w_C/μ_C`` (``δ_C`` the weight of C's top residual,
    ``R_C`` the restriction to C's residual slots). On one clique ``E_C = U_C`` (the Kronecker
    product of ``U_a = [1/n_a, Q_aᵀ]``) is square and invertible: the columns of ``U_a`` are
    orthogonal with squared norms ``(1/n_a, 1, …, 1)``, so ``U_a⁻¹ = diag(n_a, 1, …, 1) U_aᵀ`` and

        B_C⁻¹ = S_C U_Cᵀ D_C⁻¹ U_C S_C,     S_C = diag(n_{C∖A}) on the slots           (P1)

    (one synthesis and one analysis per clique). The pieces are combined as
    ``M⁻¹ = Σ_C R_Cᵀ Ω_C B_C⁻¹ Ω_C R_C`` with ``Ω_C = diag(B_C) / diag(H)`` per slot: symmetric,
    positive definite on the free residuals, and exactly ``H⁻¹`` when every ``B_C`` is diagonal
    (``Σ_C h_C² / (H² h_C) = 1 / H``), i.e. Jacobi where the cliques do not couple and the exact
    block inverse on a residual only one clique holds (its top interaction). Cost: about one
    expand and one adjoint per application.
    """

    def __init__(self, family: SetFamily, free: np.ndarray, top_weight: np.ndarray) -> None:
        self.family = family
        self.free = free
        self.rest = complement_sizes(family)
        self.floor = top_weight  # δ_C on every clique cell

    def _transform(self, source: np.ndarray, analyse: bool) -> np.ndarray:
        """``U_C`` (or ``U_Cᵀ``) on every clique of a flat slot (cell) vector."""
        return self.family.transform(source, analyse)

    def _per_clique_sum(self, slots: np.ndarray) -> list[np.ndarray]:
        return [self.family.view(slots, g).reshape(len(g.axes), -1).sum(axis=1) for g in self.family.groups]

    def update(self, cell_curvature: np.ndarray, hessian_diagonal: np.ndarray) -> None:
        """``cell_curvature = λ w/μ`` on the cliques' cells, ``hessian_diagonal`` that of ``H``.

        The held total (slot 0 of every clique, ``A = ∅``) is fixed, so the block wanted is the
        inverse of ``B_C`` without that row and column: by the Schur complement,
        ``(B_C⁻¹)_ff − z zᵀ / z_∅`` with ``z = B_C⁻¹ e_∅ = S_C U_Cᵀ D_C⁻¹ 1`` (``U_C S_C e_∅`` is the
        constant 1). Other fixed residuals (exact measurements) are only masked."""
        self.inverse_cells = 1.0 / (self.floor + cell_curvature)
        local = clique_diagonals(self.family, self.floor + cell_curvature)
        self.slot_scale = self.rest * local / hessian_diagonal[self.family._indices()]
        self.total_column = self.rest * self._transform(self.inverse_cells, analyse=True)
        self.total_entry = [self.family.view(self.total_column, g).reshape(len(g.axes), -1)[:, 0]
                            for g in self.family.groups]

    def __call__(self, v: np.ndarray) -> np.ndarray:
        family = self.family
        v = np.where(self.free, v, 0.0)
        weighted = v[family._indices()] * (self.slot_scale / self.rest)  # Ω R v (slot_scale holds S Ω)
        slots = self.rest * self._transform(self._transform(weighted * self.rest, analyse=False)
                                            * self.inverse_cells, analyse=True)  # B_C⁻¹ Ω R v
        along = self._per_clique_sum(self.total_column * weighted)
        for g, a, z0 in zip(family.groups, along, self.total_entry):  # the Schur correction
            family.view(slots, g).reshape(len(g.axes), -1)[...] -= \
                family.view(self.total_column, g).reshape(len(g.axes), -1) * (a / z0)[:, None]
        slots *= self.slot_scale / self.rest  # Ω, then Rᵀ summed over the cliques
        out = np.bincount(family._indices(), weights=slots, minlength=family.index.size)
        out[~self.free] = 0.0
        return out


class StackedFamily:
    """Two families' cells in one vector (cliques, then the subsets of the conditional counting
    numbers): ``expand``, ``adjoint`` and :func:`squared_adjoint` act on both parts."""

    def __init__(self, first: SetFamily, second: SetFamily) -> None:
        self.parts = (first, second)
        self.index = first.index
        self.size = first.size + second.size

    def expand(self, r: np.ndarray) -> np.ndarray:
        return np.concatenate([f.expand(r) for f in self.parts])

    def adjoint(self, cells: np.ndarray) -> np.ndarray:
        first, second = self.parts
        return first.adjoint(cells[:first.size]) + second.adjoint(cells[first.size:])


def clique_log_prior(family: SetFamily, factors: list[np.ndarray], total: float) -> np.ndarray:
    """``log π_C`` over the family's cells for the product prior ``π = N̂ Π_a p_a / N̂`` (one factor
    ``p_a`` per attribute, each summing to ``N̂``): consistent across cliques, strictly positive."""
    out = np.empty(family.size)
    logs = [np.log(np.asarray(p, dtype=np.float64) / total) for p in factors]
    for g in family.groups:
        view = family.view(out, g)
        view[...] = math.log(total)
        for j, n in enumerate(g.sizes):
            shape = [len(g.axes)] + [1] * len(g.sizes)
            shape[1 + j] = n
            view += np.stack([logs[a] for a in g.axes[:, j]]).reshape(shape)
    return out


# ---- the problem and its solution --------------------------------------------------------------
@dataclass
class LocalSmoothProblem:
    """Problem (L1) of the module notes, all vectors flat.

    Attributes
    ----------
    family : SetFamily
        The cliques (``μ = family.expand(r)``).
    target, weight : ndarray
        ``r̂`` and ``W`` per residual coordinate (``W > 0`` on every free coordinate).
    free : ndarray of bool
        Per residual coordinate: not fixed.
    clique_weight : ndarray
        ``w_C`` per clique cell (``family.per_set`` of the per-clique weights).
    lam : float
        ``λ``.
    """

    family: SetFamily
    target: np.ndarray
    weight: np.ndarray
    free: np.ndarray
    clique_weight: np.ndarray
    lam: float

    def value(self, r: np.ndarray, mu: np.ndarray, log_prior: np.ndarray) -> float:
        """``f_k(r)`` at ``μ = E r`` (``+inf`` off ``μ > 0``)."""
        if not mu.min(initial=1.0) > 0:
            return math.inf
        d = r - self.target
        prior = np.exp(log_prior)
        kl = np.sum(self.clique_weight * (mu * (np.log(mu) - log_prior) - mu + prior))
        return float(0.5 * np.sum(self.weight * d * d) + self.lam * kl)

    def gradient(self, r: np.ndarray, mu: np.ndarray, log_prior: np.ndarray) -> np.ndarray:
        """``W (r − r̂) + λ Eᵀ (w log(μ/π))`` on the free coordinates, 0 on the fixed ones."""
        g = self.weight * (r - self.target)
        g += self.lam * self.family.adjoint(self.clique_weight * (np.log(mu) - log_prior))
        g[~self.free] = 0.0
        return g

    def hessian_product(self, v: np.ndarray, curvature: np.ndarray) -> np.ndarray:
        """``P (W + λ Eᵀ diag(curvature) E) P v`` with ``curvature = w/μ`` and ``P`` the free mask."""
        v = np.where(self.free, v, 0.0)
        out = self.weight * v + self.lam * self.family.adjoint(curvature * self.family.expand(v))
        out[~self.free] = 0.0
        return out

    def gap_bound(self, g: np.ndarray) -> float:
        """``½ gᵀ W⁻¹ g`` over the free coordinates: ``f_k(r) − f_k*`` at most this (strong convexity)."""
        return float(0.5 * np.sum(g[self.free] ** 2 / self.weight[self.free]))


@dataclass
class LocalSmoothSolution:
    """The last proximal step's point and certificate; ``steps`` one dict per proximal step."""

    r: np.ndarray
    mu: np.ndarray
    converged: bool
    stopped: str
    gap: float
    value: float
    products: int
    newton: int
    steps: list = field(default_factory=list)


def _newton(problem: LocalSmoothProblem, r: np.ndarray, mu: np.ndarray, log_prior: np.ndarray, tol: float,
            max_newton: int, max_cg: int, deadline: float | None, log=None, shrink_limit: float = STEP_FRACTION,
            block: CliqueBlockPreconditioner | None = None):
    """Newton's method with preconditioned CG on one step's ``f_k`` from a point with ``μ > 0``.
    Returns ``(r, μ, value, relative gap bound, products, Newton steps, why it stopped)``."""
    family = problem.family
    products = 0
    value = problem.value(r, mu, log_prior)
    g = problem.gradient(r, mu, log_prior)
    products += 1
    for it in range(max_newton + 1):
        gap = problem.gap_bound(g) / (1.0 + abs(value))
        if log is not None:
            log(f"newton {it}: value {value:.9g} gap bound {gap:.2e} smallest cell {float(mu.min()):.3g} "
                f"products {products}")
        if gap <= tol:
            return r, mu, value, gap, products, it, "certified"
        if it == max_newton:
            return r, mu, value, gap, products, it, "Newton step limit"
        if deadline is not None and time.perf_counter() > deadline:
            return r, mu, value, gap, products, it, "time limit"
        curvature = problem.clique_weight / mu
        diag = problem.weight + problem.lam * squared_adjoint(family, curvature)
        diag = np.where(problem.free, diag, 1.0)
        # Inexact Newton (Dembo, Eisenstat, Steihaug 1982): CG to a relative residual that
        # tightens as the gap closes.
        forcing = min(0.5, math.sqrt(gap))
        if block is None:
            precondition = diag.__rtruediv__  # Jacobi: v / diag
        else:
            block.update(problem.lam * curvature[:block.family.size], diag)
            precondition = block
        d, used = _pcg(lambda v: problem.hessian_product(v, curvature), -g, precondition, forcing, max_cg)
        products += used
        if log is not None:
            log(f"  CG {used} products (forcing {forcing:.1e})")
        step_mu = family.expand(d)
        products += 1
        shrinking = step_mu < 0
        t = 1.0
        if shrinking.any():
            t = min(1.0, shrink_limit * float(np.min(-mu[shrinking] / step_mu[shrinking])))
        slope = float(g @ d)
        if not slope < 0:
            return r, mu, value, gap, products, it, "not a descent direction"
        while True:
            trial_r = r + t * d
            trial = problem.value(trial_r, mu + t * step_mu, log_prior)
            if trial <= value + 1e-4 * t * slope:
                # μ afresh, not accumulated (no drift between r and μ); a cell that rounding puts
                # at or below zero (a barrier cell near underflow) cuts the step again
                trial_mu = family.expand(trial_r)
                products += 1
                if trial_mu.min() > 0:
                    break
            t *= 0.5
            if t < 1e-12:
                return r, mu, value, gap, products, it, "line search failed"
        if log is not None:
            log(f"  step length {t:.2e}")
        r, mu = trial_r, trial_mu
        value = problem.value(r, mu, log_prior)
        g = problem.gradient(r, mu, log_prior)
        products += 1
    return r, mu, value, gap, products, max_newton, "Newton step limit"


#: A primal-dual step lowers a clique cell by at most this factor e^(−LOG_STEP_FLOOR) (no overflow to 0).
LOG_STEP_FLOOR = 30.0
#: The primal-dual merit's weight on ``E r − μ``: "uniform" (``λ |w| n_C / N``, fixed) or "curvature"
#: (``λ |w| / μ`` at the iterate, fixed along its line search).
PD_MERIT = "uniform"
#: The primal-dual CG's largest relative residual (then the relative merit: quadratic convergence).
PD_FORCING = 1e-2


def _newton_pd(problem: LocalSmoothProblem, r: np.ndarray, mu_pd: np.ndarray, log_prior: np.ndarray, tol: float,
               max_newton: int, max_cg: int, deadline: float | None, log=None, shrink_limit: float = STEP_FRACTION,
               block: CliqueBlockPreconditioner | None = None, subsets: bool = False,
               log_floor: float = LOG_STEP_FLOOR):
    """Primal-dual Newton on (L1): the clique cells ``μ_C`` are variables of their own, tied to ``E_C r``
    by an equation, so a step is not cut where ``E_C (r + t d)`` would leave ``μ > 0``.

    With ``ν = log(μ_C / π_C)`` the optimality conditions of ``min f_k`` over ``(r, μ_C)`` subject
    to ``E_C r = μ_C`` (the multiplier is ``y = λ w ν``, substituted) are

        R1 = W (r − r̂) + λ E_Cᵀ (w ν) + λ E_Sᵀ (w log(E_S r / π_S)) = 0,   R3 = E_C r − μ_C = 0   (PD)

    (``S``: the subset cells of the conditional counting numbers, kept primal: they are sums of
    clique cells and never near zero on adult). Newton on (PD) with ``dμ = μ dν`` eliminates
    ``dν = (E_C d + R3) / μ_C`` and leaves ``H d = −R1 − λ E_Cᵀ (w R3 / μ_C)`` with the primal
    Hessian ``H`` at the cells ``(μ_C, E_S r)``: the same CG and preconditioner. The update is
    ``r + t d`` and, per clique cell, ``μ (1 + t dν)`` where it rises (at ``t = 1`` exactly
    ``E_C (r + d)``, the primal step) and ``μ exp(max(t dν, −LOG_STEP_FLOOR))`` where it falls: positive
    for every ``t``, tangent to the Newton step at ``t = 0``. ``t`` backtracks on the merit
    ``½ R1ᵀ W⁻¹ R1 + ½ Σ (λ w n_C / N) R3²`` (Armijo; the first term is the certificate's
    ``½ gᵀ W⁻¹ g`` when ``R3 = 0``), and only the subset cells keep the fraction-to-boundary rule.

    Only ``r`` is certified: after every step ``μ = E r`` afresh and, where ``μ > 0``, the primal
    certificate of :meth:`LocalSmoothProblem.gap_bound` (exact, whatever ``μ_C`` is). Returns
    ``(r, μ, value, relative gap bound, products, Newton steps, why it stopped, μ_C)`` with
    ``μ = E r`` when certified.

    ``subsets``: the subset cells of the conditional counting numbers are variables too (then
    ``μ_C`` above holds every cell; their weights are negative, so away from ``E r = μ`` the
    Newton matrix may be indefinite: CG stops at non-positive curvature). Why: with the subsets
    primal, an infeasible step that sends a clique cell's ``E_C r`` negative drags the subset
    cells above it towards zero, and their fraction-to-boundary rule cuts the next steps."""
    family = problem.family
    parts = family.parts if isinstance(family, StackedFamily) else (family,)
    nc = family.size if subsets else parts[0].size
    w, lam, free = problem.clique_weight, problem.lam, problem.free
    # the merit's weight on R3: λ |w| at the uniform table's cell N / n_C (fixed; the prior's own cells,
    # at later proximal steps the last step's μ down to 1e-12, would weigh a barrier cell's R3 ~1e12 ×)
    cell_counts = np.concatenate([f.per_set(f.cells.astype(np.float64)) for f in parts])[:nc]
    total = float(np.exp(log_prior[:parts[0].size]).sum()) / len(parts[0].cells)
    penalty = lam * np.abs(w[:nc]) * cell_counts / total
    inverse_weight = np.where(free, 1.0 / problem.weight, 0.0)

    def residuals(r, mu_c, primal, penalty):
        ratio = np.log(np.concatenate([mu_c, primal[nc:]])) - log_prior
        r1 = problem.weight * (r - problem.target) + lam * family.adjoint(w * ratio)
        r1[~free] = 0.0
        r3 = primal[:nc] - mu_c
        return r1, r3, float(0.5 * np.sum(r1 * r1 * inverse_weight) + 0.5 * np.sum(penalty * r3 * r3))

    def weights(mu_c):  # the merit's weight on R3: fixed (uniform cell) or the curvature at the iterate
        return penalty if PD_MERIT == "uniform" else lam * np.abs(w[:nc]) / mu_c

    def certificate(r, primal):
        if not primal.min() > 0:
            return math.nan, math.inf
        value = problem.value(r, primal, log_prior)
        return value, problem.gap_bound(problem.gradient(r, primal, log_prior)) / (1.0 + abs(value))

    products = 0
    primal = family.expand(r)
    r1, r3, merit = residuals(r, mu_pd, primal, weights(mu_pd))
    value, gap = certificate(r, primal)
    products += 3
    reference = abs(value) if math.isfinite(value) else 1.0
    restarted = False
    for it in range(max_newton + 1):
        if math.isfinite(value):
            reference = abs(value)
        if log is not None:
            log(f"pd newton {it}: value {value:.9g} gap bound {gap:.2e} merit {merit / (1 + reference):.2e} "
                f"|E r - mu| {float(np.abs(r3).max()):.1e} smallest cell {float(mu_pd.min()):.3g} "
                f"(E r {float(primal.min()):.3g}) products {products}")
        if gap <= tol:
            return r, primal, value, gap, products, it, "certified", mu_pd
        if it == max_newton:
            return r, primal, value, gap, products, it, "Newton step limit", mu_pd
        if deadline is not None and time.perf_counter() > deadline:
            return r, primal, value, gap, products, it, "time limit", mu_pd
        cells = np.concatenate([mu_pd, primal[nc:]])
        curvature = w / cells
        diag = problem.weight + lam * squared_adjoint(family, curvature)
        diag = np.where(free, diag, 1.0)
        # tighter than the primal forcing, in the preconditioned norm: the right side is dominated by
        # the stiff R3 / μ terms, so a small Euclidean residual can leave the weak directions unsolved
        # and the direction need not descend on the merit
        forcing = min(PD_FORCING, merit / (1.0 + reference))
        if block is None:
            precondition = diag.__rtruediv__
        else:
            block.update(lam * curvature[:block.family.size], diag)
            precondition = block
        rhs = -r1 - lam * family.adjoint(np.concatenate([w[:nc] * r3 / mu_pd, np.zeros(family.size - nc)]))
        rhs[~free] = 0.0
        d, used = _pcg(lambda v: problem.hessian_product(v, curvature), rhs, precondition, forcing, max_cg,
                       energy=True)
        products += used + 2
        step_cells = family.expand(d)
        products += 1
        log_step = (step_cells[:nc] + r3) / mu_pd
        t = 1.0
        falling = step_cells[nc:] < 0  # subset cells: primal, so the fraction-to-boundary rule
        if falling.any():
            t = min(1.0, shrink_limit * float(np.min(-primal[nc:][falling] / step_cells[nc:][falling])))
        rising = log_step >= 0
        if PD_MERIT != "uniform":  # the merit at this iterate's weights
            r1, r3, merit = residuals(r, mu_pd, primal, weights(mu_pd))
            products += 1
        current = weights(mu_pd)
        while True:
            trial_r = r + t * d
            trial_mu = mu_pd * np.where(rising, 1.0 + t * log_step, np.exp(np.maximum(t * log_step, -log_floor)))
            trial_primal = primal + t * step_cells
            if trial_primal[nc:].min(initial=1.0) > 0 and trial_mu.min() > 0:
                t1, t3, trial_merit = residuals(trial_r, trial_mu, trial_primal, current)
                products += 1
                if trial_merit <= (1.0 - 2e-4 * t) * merit:
                    fresh = family.expand(trial_r)  # E r afresh, not accumulated
                    products += 1
                    if fresh[nc:].min(initial=1.0) > 0:
                        break
            t *= 0.5
            if t < 1e-12:
                break
        if t < 1e-12:
            if restarted or not primal.min() > 0:
                return r, primal, value, gap, products, it, "line search failed", mu_pd
            # restart from the feasible point μ_C = E_C r (where that is positive): the merit is then
            # the certificate's, and the infeasibility a long step left (adult eps 1: |E r − μ| 61)
            # no longer steers the step
            mu_pd = primal[:nc].copy()
            restarted = True
            if log is not None:
                log("  line search failed: restart at mu = E r")
        else:
            if log is not None:
                log(f"  CG {used} products (forcing {forcing:.1e}), step length {t:.2e}")
            r, mu_pd, primal = trial_r, trial_mu, fresh
            restarted = False
        r1, r3, merit = residuals(r, mu_pd, primal, weights(mu_pd))
        value, gap = certificate(r, primal)
        products += 2
    return r, primal, value, gap, products, max_newton, "Newton step limit", mu_pd


def _pcg(product, b: np.ndarray, precondition, rtol: float, max_iter: int,
         energy: bool = False) -> tuple[np.ndarray, int]:
    """Preconditioned conjugate gradients for ``H x = b`` from 0 (``precondition(r) ≈ H⁻¹ r``);
    ``(x, products)``. Stops at ``||res|| ≤ rtol ||b||``, or with ``energy`` at
    ``resᵀ M⁻¹ res ≤ rtol² bᵀ M⁻¹ b`` (≈ the error in ``H``'s norm: a right side dominated by a few
    stiff entries then does not hide the error in the weak directions)."""
    x = np.zeros_like(b)
    res = b.copy()
    z = precondition(res)
    p = z.copy()
    rz = float(res @ z)
    target = rtol * math.sqrt(rz if energy else float(b @ b))
    used = 0
    for used in range(1, max_iter + 1):
        hp = product(p)
        curve = float(p @ hp)
        if not curve > 0:  # not positive definite along p (the primal-dual Hessian off E r = μ): stop
            if used == 1:
                x = p.copy()  # the preconditioned steepest descent direction
            break
        alpha = rz / curve
        x += alpha * p
        res -= alpha * hp
        if not energy and math.sqrt(float(res @ res)) <= target:
            break
        z = precondition(res)
        rz_new = float(res @ z)
        if energy and math.sqrt(max(rz_new, 0.0)) <= target:
            break
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, used


def solve_local_smooth(problem: LocalSmoothProblem, start: np.ndarray, log_prior: np.ndarray, *, steps: int = 3,
                       tol: float = CERTIFICATE_TOL, max_newton: int = 100, max_cg: int = 200,
                       time_limit: float | None = None, log=None,
                       shrink_limit: float = STEP_FRACTION, block: CliqueBlockPreconditioner | None = None,
                       lam_path: tuple[float, float] | None = None, path_tol: float = 1e-3,
                       path_adapt: bool = False, newton: str = "primal",
                       log_floor: float = LOG_STEP_FLOOR) -> LocalSmoothSolution:
    """``K = steps`` proximal steps of (L1) from ``start`` (its ``μ`` strictly positive, fixed
    coordinates at their values), each solved to a relative gap bound ``tol / 10`` and certified
    at ``tol``; the prior of step ``k > 1`` is step ``k − 1``'s ``μ``.

    ``block``: the per-clique preconditioner (else Jacobi). ``lam_path = (start, shrink)``: every
    step first solves (L1) at ``λ · start``, ``λ · start · shrink``, … (while above ``λ``) to the
    relative gap ``path_tol``, each warm-started from the last (a homotopy: at large ``λ`` the
    problem is near its prior and well conditioned); only the final ``λ``'s point is certified.
    ``path_adapt``: after a stage of more than 3 Newton steps the next factor is the square root of
    the last, after a shorter one its square (at most ``shrink``). ``newton="primal-dual"``:
    :func:`_newton_pd` (clique cells as variables of their own) instead of :func:`_newton`;
    ``"primal-dual-all"``: the subset cells too. The certificate is the same, on ``r``."""
    clock = time.perf_counter()
    deadline = None if time_limit is None else clock + float(time_limit)
    r = start.copy()
    mu = problem.family.expand(r)
    if not mu.min(initial=1.0) > 0:
        raise ValueError("the starting point has a clique cell at or below zero")
    total_products, total_newton, records = 0, 0, []
    value, gap, stopped = math.nan, math.inf, "no step"
    if newton not in ("primal", "primal-dual", "primal-dual-all"):
        raise ValueError(f"newton must be 'primal', 'primal-dual' or 'primal-dual-all', got {newton!r}")
    clique_cells = problem.family.parts[0].size if isinstance(problem.family, StackedFamily) else problem.family.size
    if newton == "primal-dual-all":
        clique_cells = problem.family.size
    mu_pd = mu[:clique_cells].copy()

    def solve(staged, r, mu, mu_pd, stage_tol):
        if newton == "primal":
            return (*_newton(staged, r, mu, log_prior, stage_tol, max_newton, max_cg, deadline, log, shrink_limit,
                             block), mu_pd)
        return _newton_pd(staged, r, mu_pd, log_prior, stage_tol, max_newton, max_cg, deadline, log, shrink_limit,
                          block, subsets=newton == "primal-dual-all", log_floor=log_floor)

    for k in range(steps):
        if k > 0:
            log_prior = np.log(mu)
            mu_pd = mu[:clique_cells].copy()
        tick = time.process_time()
        scale, shrink = lam_path if lam_path is not None else (1.0, 1.0)
        factor = shrink
        while scale > 1.0:
            staged = replace(problem, lam=problem.lam * scale)
            if log is not None:
                log(f"path: lambda x {scale:.3g}")
            r, mu, _, _, products, iterations, why, mu_pd = solve(staged, r, mu, mu_pd, path_tol)
            total_products += products
            total_newton += iterations
            if why == "time limit":
                break
            if path_adapt:
                # a stage that needed many (damped) Newton steps was too long a jump: shorten the
                # next one (square root of the factor); a quick one lengthens it again
                factor = math.sqrt(factor) if iterations > 3 else max(shrink, factor * factor)
            scale *= factor
        r, mu, value, gap, products, iterations, stopped, mu_pd = solve(problem, r, mu, mu_pd, tol / 10)
        total_products += products
        total_newton += iterations
        records.append({"step": k + 1, "gap": gap, "value": value, "products": products, "newton": iterations,
                        "stopped": stopped, "cpu_seconds": time.process_time() - tick,
                        "smallest_cell": float(mu.min())})
        if stopped != "certified":
            break
    converged = stopped == "certified" and gap <= tol and bool(mu.min(initial=1.0) > 0)
    return LocalSmoothSolution(r, mu, converged, stopped, gap, value, total_products, total_newton, records)


# ---- from measurements to the estimate -----------------------------------------------------------
def estimate_local_smooth(measurements, workload=None, constraints=None, *, steps: int = 3,
                          smoothing: float | None = None, prior: str = "per-attribute", tol: float = CERTIFICATE_TOL,
                          max_newton: int = 100, max_cg: int = 200, time_limit: float | None = None,
                          max_cells: int = 2**27, log=None, shrink_limit: float = STEP_FRACTION,
                          start_mix: float = 0.0, counting: str = "cliques", preconditioner: str = "jacobi",
                          lam_path: tuple[float, float] | None = None, path_tol: float = 1e-3,
                          path_adapt: bool = False, newton: str = "primal", log_floor: float = LOG_STEP_FLOOR):
    """The local smooth estimate (module notes) of the workload's marginals.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy (or exact: variance 0) marginals, totals or the identity over one domain.
    workload : iterable of attribute lists, optional
        Marginals to release (default: the measured sets); unmeasured interactions get the
        least-squares estimator's weak prior.
    constraints : ConstraintSet, optional
        Non-negativity (kept: ``μ > 0``), integrality (ignored) and invariants on marginals
        (fixed residuals); structural zeros, hierarchies and inequalities are refused.
    steps, smoothing, prior
        ``K``, ``c`` in ``λ = c / σ̄`` (default ``1 / (2^{1/K} − 1)``) and the first step's prior,
        as for the junction-tree smooth estimate.
    tol, max_newton, max_cg, time_limit, max_cells
        Certificate tolerance, Newton steps per proximal step, CG steps per Newton step,
        seconds, and the largest number of clique cells held.
    preconditioner : {"jacobi", "block"}
        CG's preconditioner: the Hessian's diagonal, or :class:`CliqueBlockPreconditioner`.
    lam_path, path_tol, path_adapt
        A λ homotopy before every step (:func:`solve_local_smooth`).
    newton : {"primal", "primal-dual", "primal-dual-all"}
        Newton's method on ``r`` alone, or with the clique cells (and the subset cells) as
        variables (:func:`_newton_pd`); ``log_floor``: its largest fall of a cell's log per step.

    Returns
    -------
    MarginalEstimate
        ``objective == "smooth-local"``; OPTIMAL only when every step's certificate holds.
    """
    from dpopt.errors import DomainError, ParameterError
    from dpopt.estimate.engines.smooth import default_smoothing
    from dpopt.estimate.marginal_space.estimator import PRIOR_RATIO, _chi_square, _constraint_parts, sets_and_domain
    from dpopt.estimate.marginal_space.graphical.smooth import attribute_priors, check_smooth_options
    from dpopt.estimate.marginal_space.gls import fit_residuals
    from dpopt.estimate.marginal_space.layout import ResidualIndex, maximal_sets, measured_and_workload_axes
    from dpopt.estimate.marginal_space.polytope.interior import interior_residuals
    from dpopt.estimate.marginal_space.prior import independence_prior
    from dpopt.estimate.marginal_space.result import MarginalEstimate
    from dpopt.estimate.status import Status

    start_clock = time.perf_counter()
    measurements = list(measurements)
    sets, domain = sets_and_domain(measurements, "estimate_local_smooth")
    check_smooth_options(prior, steps, smoothing)
    zeros, exact = ([], []) if constraints is None else _constraint_parts(constraints, domain)
    if zeros:
        raise ParameterError("the local smooth estimate cannot hold a cell at zero (its entropy is a barrier: "
                             "every cell stays positive); structural zeros and hierarchies need objective 'l2'")
    all_axes, work = measured_and_workload_axes(domain, sets, workload, "estimate_local_smooth")
    measured_axes = [a for a in all_axes if a]
    extra = [a for a, _, _ in exact if a]
    held = {a for s in work + measured_axes + extra for a in s}
    loose = [(a,) for a in range(len(domain)) if a not in held]
    cliques = maximal_sets(work + measured_axes + extra + loose)
    sizes = [int(s) for s in domain.sizes]
    clique_cells = sum(math.prod(sizes[a] for a in c) for c in cliques)
    if clique_cells > max_cells:
        raise DomainError(f"the marginals to hold have {clique_cells:,} cells, above max_cells = {max_cells:,}")

    index = ResidualIndex(domain, cliques)
    family = SetFamily(index, cliques)
    labels = [m.label for m in measurements] + [name for _, _, name in exact]
    values = [np.asarray(m.values, dtype=np.float64) for m in measurements] + [v for _, v, _ in exact]
    variances = np.concatenate([[float(m.variance) for m in measurements], np.zeros(len(exact))])
    fit = fit_residuals(index, all_axes + [a for a, _, _ in exact], values, variances, labels)
    noisy = [i for i, m in enumerate(measurements) if float(m.variance) > 0]
    if not noisy:
        raise ParameterError("the local smooth estimate needs at least one noisy measurement")
    # The smooth estimate's total and λ (graphical/smooth.py): N̂ the inverse-variance total, held.
    rows = np.array([values[i].size for i in noisy], dtype=np.float64)
    var = variances[noisy]
    w_total = 1.0 / (var * rows)
    n_hat = float(np.sum(w_total * np.array([values[i].sum() for i in noisy])) / w_total.sum())
    n_se = float(1.0 / np.sqrt(w_total.sum()))
    empty = index.position_of(())
    if fit.fixed[empty]:
        total = float(fit.target[index.set_offsets[empty]])
        if not total > 0:
            raise ParameterError(f"the local smooth estimate needs a positive total, the exact one is {total:g}")
    else:
        total = max(n_hat, n_se)
        fit.fixed = fit.fixed.copy()
        fit.fixed[empty] = True
        fit.target = fit.target.copy()
        fit.target[index.set_offsets[empty]] = total
    c = default_smoothing(steps) if smoothing is None else float(smoothing)
    lam = c * float(np.sqrt(np.sum(rows / var) / rows.sum()))

    # Unmeasured residuals: the least-squares estimator's weak prior (its step 3), so W > 0.
    diagonal = family.diagonal()
    weight = fit.weight.copy()
    free_sets = (weight > 0) & ~fit.fixed
    scale = float(np.max(diagonal[free_sets] / weight[free_sets])) if free_sets.any() else 1.0
    unmeasured = ~fit.measured
    weight[unmeasured] = diagonal[unmeasured] / (PRIOR_RATIO * scale)
    target = independence_prior(index, fit.target, fit.measured) if unmeasured.any() else fit.target

    used = [i for i in noisy if all_axes[i]]  # the noisy marginals (totals say nothing of a one-way)
    factors = [p for p, _ in attribute_priors(prior, total, [all_axes[i] for i in used], [values[i] for i in used],
                                              [float(variances[i]) for i in used], sizes, lam, steps)]
    log_prior = clique_log_prior(family, factors, total)
    per_coordinate_diagonal = index.per_set(diagonal)
    if exact:
        start = interior_residuals(index, [(a, v) for a, v, _ in exact if a], [], total)
        if start is None:
            raise ParameterError("the local smooth estimate found no strictly positive point of the exact marginals")
    else:
        # The prior's residuals (consistent), or its mixture with the uniform table (a table too,
        # so consistent) to lift the prior's smallest cells away from the barrier.
        point = np.exp(log_prior) if start_mix == 0 else \
            (1 - start_mix) * np.exp(log_prior) + start_mix * total / family.per_set(family.cells.astype(np.float64))
        start = family.adjoint(point) / per_coordinate_diagonal
    fixed_flat = index.per_set(fit.fixed) > 0
    start[fixed_flat] = fit.target[fixed_flat]
    if not family.expand(start).min(initial=1.0) > 0:
        raise ParameterError("the exact marginals hold a cell at zero, which the local smooth estimate cannot keep "
                             "(its entropy is a barrier); use objective 'l2'")
    solving, cell_weight = family, np.ones(family.size)
    if counting == "conditional":
        # Each clique C of k >= 2 attributes spreads one unit over its (k-1)-subsets S:
        # KL_C - (1/k) sum_S KL_S, an average of conditional divergences (convex), which takes
        # curvature off the lower orders that many cliques share (module notes, Weights).
        below: dict = {}
        for c in cliques:
            for s in combinations(c, len(c) - 1) if len(c) >= 2 else ():
                below[s] = below.get(s, 0.0) - 1.0 / len(c)
        subsets = list(below)
        sub = SetFamily(index, subsets)
        solving = StackedFamily(family, sub)
        cell_weight = np.concatenate([cell_weight, sub.per_set(np.array([below[s] for s in subsets]))])
        log_prior = np.concatenate([log_prior, clique_log_prior(sub, factors, total)])
    elif counting != "cliques":
        raise ParameterError(f"counting must be 'cliques' or 'conditional', got {counting!r}")
    problem = LocalSmoothProblem(solving, target, index.per_set(weight), ~fixed_flat, cell_weight, lam)
    block = None
    if preconditioner == "block":
        # δ_C: the weight of each clique's top residual (its last tensor slot), on its cells
        top = np.empty(family.size)
        for g in family.groups:
            family.view(top, g)[...] = problem.weight[g.source[:, -1]].reshape((-1,) + (1,) * len(g.sizes))
        block = CliqueBlockPreconditioner(family, ~fixed_flat, top)
    elif preconditioner != "jacobi":
        raise ParameterError(f"preconditioner must be 'jacobi' or 'block', got {preconditioner!r}")
    remaining = None if time_limit is None else max(float(time_limit) - (time.perf_counter() - start_clock), 1e-3)
    solved = solve_local_smooth(problem, start, log_prior, steps=steps, tol=tol, max_newton=max_newton,
                                max_cg=max_cg, time_limit=remaining, log=log, shrink_limit=shrink_limit,
                                block=block, lam_path=lam_path, path_tol=path_tol, path_adapt=path_adapt,
                                newton=newton, log_floor=log_floor)
    status = Status.OPTIMAL if solved.converged else (Status.TIME_LIMIT if solved.stopped == "time limit"
                                                      else Status.NUMERICAL_ERROR)
    message = (f"{'certified' if solved.converged else 'not certified (' + solved.stopped + ')'}: relative gap "
               f"bound {solved.gap:.1e} (tolerance {tol:g}) at proximal step {len(solved.steps)} of {steps}, "
               f"smallest cell {float(solved.mu.min()):.3g}; {solved.newton} Newton steps, "
               f"{solved.products} products")
    certificate = {"gap": solved.gap, "tol": tol, "smallest_cell": float(solved.mu.min()),
                   "primal": solved.value, "ok": solved.converged}
    info = {"certificate": certificate, "lambda": lam, "smoothing": c, "steps": int(steps), "prior": prior,
            "held_total": total, "polytope": "local", "cliques": len(cliques), "clique_cells": int(family.size),
            "residual_cells": int(index.size), "products": solved.products, "newton_steps": solved.newton,
            "step_records": solved.steps, "stopped": solved.stopped,
            "unmeasured_residual_sets": int(unmeasured.sum()), "fixed_residual_sets": int(fit.fixed.sum())}
    noisy_ms = [measurements[i] for i in noisy]
    chi2 = _chi_square(SetFamily(index, [all_axes[i] for i in noisy]), solved.r, noisy_ms)
    return MarginalEstimate(
        status=status, success=status is Status.OPTIMAL, message=message, fun=chi2, objective="smooth-local",
        backend="marginal_space", solver="Newton-CG on the residuals (local smooth, certified by strong convexity)",
        domain=domain, workload=tuple(tuple(domain.attrs[a] for a in w) for w in work),
        cliques=tuple(tuple(domain.attrs[a] for a in c) for c in cliques), index=index, family=family,
        residuals=solved.r, clique_marginals=solved.mu[:family.size],
        total=float(solved.r[index.set_offsets[empty]]), table=None,
        measurements=measurements, constraints=constraints, nit=solved.newton,
        time=time.perf_counter() - start_clock, incumbent=status is not Status.OPTIMAL, info=info,
        residual_weights=fit.weight)
