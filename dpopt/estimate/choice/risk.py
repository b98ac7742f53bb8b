"""Stein's unbiased risk estimate of a released table's error on each workload table.

A marginal table ``T`` on the attributes ``S`` sees the residual spaces ``U_a``, ``a ⊆ S``, each
``prod_{i∉S} n_i`` times (:mod:`dpopt.strategy.residual_planner`), so its squared error is

    ‖T x̂ − T x‖² = Σ_{a ⊆ S} prod_{i∉S} n_i · ‖c_a(x̂) − c_a(x)‖²,

``c_a`` the orthonormal coordinates of ``U_a``. Where the measurements give unbiased coordinates
``û_a`` of variance ``s_a²`` each (:mod:`dpopt.estimate.choice.statistics`), Stein's lemma (Stein
1981, Theorem 1) turns every term into a quantity computable from the noisy answers alone:

    E ‖c_a(x̂) − c_a(x)‖² = E [ ‖c_a(x̂) − û_a‖² + 2 s_a² tr J_a − dim U_a · s_a² ],

``J_a`` the diagonal block of the Jacobian of the fitted coordinates with respect to the noisy
ones (:mod:`dpopt.estimate.choice.jacobian`; zero for a coordinate the estimate does not read).
This is SURE: unbiased for every weakly differentiable estimate when the noise is Gaussian, and
for Gaussian measurements it is free post-processing (no privacy cost, no data).

**Laplace noise.** Stein's lemma characterises the Gaussian law. For an estimate that is affine
in the noisy answers the formula above is unbiased under any noise with these variances (it uses
only second moments), and the estimates here are affine on each face of the constraints; the
bias comes from the kinks (cells entering or leaving the positive face, the penalty's curvature
changing). Under Laplace noise dpopt uses the same formula with the Laplace variances, calls it
a second-moment risk estimate, and measures its bias by simulation
(``examples/benchmarks/bench_auto.py --sure-bias``); least squares on an identity measurement has
an exact Laplace form (:func:`identity_l2_risks`).

The residuals of a table that no measurement saw (a plan that measures only the lower orders)
have no unbiased estimate; their part of the risk is not estimable and is left out, which the
report says (:attr:`TableRisk.complete`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy.special import erf

from dpopt.estimate.choice.statistics import ResidualStatistics
from dpopt.model.queries.residual import residual_dimension

__all__ = ["TableRisk", "absolute_risks", "blend_risks", "coordinate_weights", "difference_spread", "folded_mean",
           "identity_face", "identity_l2_risks", "identity_l2_variances", "risk_spread", "table_gaps", "table_risks",
           "table_set_matrix", "table_variances", "unbiased_risks"]


@dataclass(frozen=True)
class TableRisk:
    """The estimated expected total squared error of one workload table.

    Attributes
    ----------
    label : str
    risk : float
        SURE over the residuals the measurements saw.
    complete : bool
        Whether every residual of the table was measured (else ``risk`` covers a part only).
    """

    label: str
    risk: float
    complete: bool


def _table_sets(workload, table):
    attrs = table.attrs if table.kind == "marginal" else ()
    outside = float(workload.domain.size) / float(np.prod([workload.domain.size_of(a) for a in attrs])) if attrs \
        else float(workload.domain.size)
    for r in range(len(attrs) + 1):
        for sub in combinations(attrs, r):
            yield sub, outside


def coordinate_weights(stats: ResidualStatistics, workload) -> np.ndarray:
    """``Σ_T ω_T [a ⊆ S_T] prod_{i∉S_T} n_i`` for the set of every coordinate: the weight of a
    squared coordinate error in the weighted workload error."""
    per_set = np.zeros(len(stats.sets))
    for t in workload.tables:
        for a, outside in _table_sets(workload, t):
            i = stats.index(a)
            if i is not None:
                per_set[i] += t.weight * outside
    return np.repeat(per_set, stats._basis.dims)


def risk_spread(stats: ResidualStatistics, workload, fitted: np.ndarray) -> float:
    """The standard error of the weighted risk estimate: with ``û_r − ĉ_r`` read as Gaussian around
    ``c_r − ĉ_r`` (ĉ held fixed), ``Var (ĉ_r − û_r)² = 2 s_r⁴ + 4 s_r² (c_r − ĉ_r)²``, the squared bias
    estimated by ``max((ĉ_r − û_r)² − s_r², 0)``; coordinates independent."""
    w = coordinate_weights(stats, workload)
    s2 = np.repeat(stats.variances, stats._basis.dims)
    gap2 = (fitted - stats.coordinates) ** 2
    return float(np.sqrt(np.sum(w**2 * (2 * s2**2 + 4 * s2 * np.maximum(gap2 - s2, 0.0)))))


def difference_spread(stats: ResidualStatistics, workload, first: np.ndarray, second: np.ndarray) -> float:
    """The standard error of the difference of two fits' risk estimates: with both fits held
    fixed, ``(ĉ¹_r − û_r)² − (ĉ²_r − û_r)² = (ĉ¹_r − ĉ²_r)(ĉ¹_r + ĉ²_r − 2 û_r)`` has variance
    ``4 s_r² (ĉ¹_r − ĉ²_r)²`` (paired: the noise they share cancels)."""
    w = coordinate_weights(stats, workload)
    s2 = np.repeat(stats.variances, stats._basis.dims)
    return float(2.0 * np.sqrt(np.sum(w**2 * s2 * (first - second) ** 2)))


def table_set_matrix(stats: ResidualStatistics, workload):
    """The sparse ``tables × measured sets`` matrix of ``prod_{i∉S} n_i`` where the set is ``a ⊆ S``
    (the weight of a set's squared coordinate error in each table's error)."""
    import scipy.sparse as sp

    rows, cols, vals = [], [], []
    for k, t in enumerate(workload.tables):
        for a, outside in _table_sets(workload, t):
            i = stats.index(a)
            if i is not None:
                rows.append(k)
                cols.append(i)
                vals.append(outside)
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(workload.tables), len(stats.sets)))


def _per_set(stats: ResidualStatistics, squares: np.ndarray) -> np.ndarray:
    starts = np.concatenate([[0], np.cumsum(stats._basis.dims)[:-1]]).astype(int)
    return np.add.reduceat(squares, starts) if squares.size else np.zeros(len(stats.sets))


def table_gaps(stats: ResidualStatistics, workload, fitted: np.ndarray, matrix=None) -> np.ndarray:
    """Per workload table, ``Σ_{a ⊆ S} prod_{i∉S} n_i ‖ĉ_a − û_a‖²`` over the measured sets: the
    fitted table's squared distance from the noisy answers, the first term of every risk estimate
    here (:func:`table_risks`; for one identity measurement ``‖T x̂ − T y‖²`` of
    :func:`identity_l2_risks`, ``û`` being the coordinates of ``y``). ``matrix``: a precomputed
    :func:`table_set_matrix`."""
    matrix = table_set_matrix(stats, workload) if matrix is None else matrix
    return matrix @ _per_set(stats, (np.asarray(fitted, dtype=np.float64) - stats.coordinates) ** 2)


def blend_risks(stats: ResidualStatistics, workload, first: np.ndarray, second: np.ndarray,
                risks_first: np.ndarray, risks_second: np.ndarray, matrix=None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The risk estimate of every convex combination ``(1 − α) x̂¹ + α x̂²`` of two fits, per table, as
    a quadratic in ``α``: returns ``(q0, q1, q2)`` with ``R_T(α) = q0_T + q1_T α + q2_T α²``.

    Every risk estimate here is ``gap(x̂) + D(x̂)``: the squared distance of the fitted coordinates
    from the noisy ones (:func:`table_gaps`) plus a term linear in the Jacobian (``2 s² tr J`` less a
    constant; for least squares on the histogram its zero-bias form). The Jacobian of the
    combination is the combination of the Jacobians, so ``D`` is linear in ``α``; the gap is the
    quadratic ``‖(1 − α) g¹ + α g²‖²`` of the two gaps ``g = ĉ − û``. ``D`` of each fit is read back
    from its risk (``D = R − gap``), so the combination is scored by the same estimate as the fits.
    ``matrix``: a precomputed :func:`table_set_matrix`.
    """
    matrix = table_set_matrix(stats, workload) if matrix is None else matrix
    g1 = np.asarray(first, dtype=np.float64) - stats.coordinates
    g2 = np.asarray(second, dtype=np.float64) - stats.coordinates
    a = matrix @ _per_set(stats, g1 * g1)
    c = matrix @ _per_set(stats, g2 * g2)
    b = matrix @ _per_set(stats, g1 * g2)  # <g1, g2> per table
    d1 = np.asarray(risks_first, dtype=np.float64) - a
    d2 = np.asarray(risks_second, dtype=np.float64) - c
    return a + d1, -2.0 * a + 2.0 * b + d2 - d1, a - 2.0 * b + c


def table_risks(stats: ResidualStatistics, workload, fitted: np.ndarray, jacobian_trace: dict) -> list[TableRisk]:
    """SURE per workload table (module notes).

    Parameters
    ----------
    stats : ResidualStatistics
    workload : Workload
        Marginal tables only.
    fitted : ndarray
        The released table's coordinates on ``stats.sets`` (:meth:`ResidualStatistics.of_table`).
    jacobian_trace : dict
        ``{a: tr J_a}`` for the sets the estimate reads (others count 0).
    """
    per_set = {}
    for i, a in enumerate(stats.sets):
        rows = stats._basis.rows_of(i)
        s2 = float(stats.variances[i])
        gap = fitted[rows] - stats.coordinates[rows]
        per_set[a] = float(gap @ gap) + 2.0 * s2 * float(jacobian_trace.get(a, 0.0)) - residual_dimension(
            stats.domain, a) * s2
    out = []
    for t in workload.tables:
        total, complete = 0.0, True
        for a, outside in _table_sets(workload, t):
            if a in per_set:
                total += outside * per_set[a]
            else:
                complete = False
        out.append(TableRisk(t.label, total, complete))
    return out


def unbiased_risks(stats: ResidualStatistics, workload) -> list[float]:
    """The exact expected total squared error of each table's least-squares answers from the
    measurements (``Σ_{a ⊆ S} dim U_a prod_{i∉S} n_i s_a²``; ``inf`` when a residual is unmeasured)."""
    out = []
    for t in workload.tables:
        total = 0.0
        for a, outside in _table_sets(workload, t):
            i = stats.index(a)
            if i is None:
                total = float("inf")
                break
            total += residual_dimension(stats.domain, a) * outside * float(stats.variances[i])
        out.append(total)
    return out


def identity_face(y: np.ndarray, x: np.ndarray, free: np.ndarray, total: str = "moving", rounds: int = 5
                  ) -> np.ndarray:
    """The cells least squares under ``x >= 0`` on one identity measurement leaves free
    (:func:`~dpopt.estimate.choice.jacobian.fitted_face` in closed form).

    With every cell's noise unit the same, the reduced gradient is ``μ_j = x_j − y_j + τ`` (``τ``
    the held total's multiplier; 0 with the total free), so the projected step's rule
    ``x_j > μ_j`` reads ``y_j > τ``: the cell is free when its noisy count is above the threshold
    the fit subtracts (``x̂_j = max(y_j − τ, 0)``), whatever its fitted size. ``τ`` is the mean of
    ``y − x`` on the face (its least-squares fit), refitted until the face stops changing; the
    first face is ``x > 0``.
    """
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    free = np.asarray(free, dtype=bool)
    face = free & (x > 0)
    for _ in range(rounds):
        tau = 0.0 if total == "free" or not face.any() else float(np.mean((y - x)[face]))
        new = free & (x > 0) & (y > tau)
        if np.array_equal(new, face):
            break
        face = new
    return face


def identity_l2_risks(workload, y: np.ndarray, x: np.ndarray, free: np.ndarray, variance: float,
                      laplace_scale: float | None = None, total: str = "moving") -> list[TableRisk]:
    """The risk of least squares under ``x >= 0`` on one identity measurement, per workload table,
    in closed form (no Jacobian over the cells).

    With the noisy histogram ``y`` and the cells ``free`` that no structural zero fixes, the fit is
    ``x̂_j = max(y_j − τ, 0)`` on the free cells (``A``: those left positive). ``total`` says what
    fixes ``τ``: ``"moving"``, the total held at ``Σ y`` (every cell's noise moves ``τ``:
    ``∂x̂_j/∂y_k = [j∈A] (δ_jk + [k∉A]/|A|)``); ``"fixed"``, held at a value that does not move
    (``∂x̂_j/∂y_k = [j∈A] (δ_jk − [k∈A]/|A|)``); ``"free"``, no total held (``τ = 0``: the clamp
    ``max(y, 0)``, ``∂x̂_j/∂y_k = [j∈A] δ_jk``). For a table ``T`` with ``G = TᵀT``,

        E ‖T x̂ − T x‖² = E [ ‖T x̂ − T y‖² + 2 σ² Σ_jk G_jk ∂x̂_k/∂y_j − σ² ‖T‖_F² ]

    (Stein's lemma under Gaussian noise, exactly). **Laplace noise** (``laplace_scale`` = ``b``):
    Stein's lemma fails, but its zero-bias form holds: ``E[Z h(Z)] = σ² E[h'(Z*)]`` with ``Z*``
    distributed as the sum of two independent Laplace draws of scale ``b`` (density
    ``(|t| + b) e^{−|t|/b} / 4b²``; Goldstein and Reinert 1997, the zero-bias transform). So the
    indicator ``[k∈A]`` of the diagonal term is replaced by its average over one more Laplace draw,
    ``π_k = P(y_k + Z' > τ)`` in closed form (``τ`` held fixed); the coupling through ``τ`` keeps its
    plug-in form. Measured bias (discrete Laplace, all 3-way marginals, 100 draws each; the
    second-moment formula in brackets): czech ε = 0.1, 0.5, 1: −2, +6, +6 % (+10, +9, +6 %);
    rochdale: +10, −2, −2 % (−18, −15, −8 %); mildew: +54, +9, +6 % (−64, −16, 0 %): a fit that
    leaves a few cells positive out of many (mildew, 70 people in 64 cells, at ε = 0.1) is
    overestimated, which only makes the rule less likely to take it (``bench_auto.py --sure-bias``).
    """
    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    free = np.asarray(free, dtype=bool)
    active = identity_face(y, x, free, total)
    if not active.any():
        return [TableRisk(t.label, float("nan"), True) for t in workload.tables]
    tau = 0.0 if total == "free" else float(np.median((y - x)[active]))
    if laplace_scale is None:
        pi = active.astype(np.float64)
    else:
        gap = (y - tau) / float(laplace_scale)
        pi = np.where(gap >= 0, 1.0 - 0.5 * np.exp(-np.abs(gap)), 0.5 * np.exp(-np.abs(gap)))
        pi[~free] = 0.0
    d = active.astype(np.float64)
    out = []
    for t in workload.tables:
        q = t.query(workload.domain)
        norms = np.broadcast_to(q.column_norm_powers(2), x.shape)
        resid = q.matvec(x - y)
        divergence = float(np.sum(norms * pi))
        if total == "moving":
            divergence += float(q.matvec(d) @ q.matvec(1.0 - d)) / float(d.sum())
        elif total == "fixed":
            td = q.matvec(d)
            divergence -= float(td @ td) / float(d.sum())
        out.append(TableRisk(t.label, float(resid @ resid + 2.0 * variance * divergence - variance * float(norms.sum())),
                             True))
    return out


def folded_mean(bias2: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """``E |b + Z|`` for ``Z ~ N(0, v)`` as a function of ``β = b²`` (the folded normal's mean,
    Leone, Nelson and Nottingham 1961): ``√(2v/π) e^{−β/2v} + √β erf(√(β/2v))``.

    ``β`` is an *estimate* here (:func:`absolute_risks`) and may come out negative; below 0 the
    function continues along its tangent at 0, ``√(2v/π) (1 + β/2v)`` (slope ``1/√(2πv)``, so the
    extension is C¹ and an unbiased ``β̂`` near 0 gives an unbiased value to first order), floored at
    0, an absolute error's least. With ``v = 0``, ``√max(β, 0)``.
    """
    beta = np.asarray(bias2, dtype=np.float64)
    v = np.asarray(variance, dtype=np.float64)
    sd = np.sqrt(np.maximum(v, 0.0))
    root = np.sqrt(np.maximum(beta, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sd > 0, root / np.where(sd > 0, sd, 1.0), np.inf)
        positive = (sd * np.sqrt(2.0 / np.pi) * np.exp(-0.5 * np.minimum(ratio, 40.0) ** 2)
                    + root * erf(ratio / np.sqrt(2)))
        tangent = np.maximum(sd * np.sqrt(2.0 / np.pi) + beta / (np.sqrt(2.0 * np.pi) * np.where(sd > 0, sd, 1.0)), 0.0)
    out = np.where(beta >= 0, positive, tangent)
    return np.where(sd > 0, out, root)


def table_variances(stats: ResidualStatistics, workload, set_variances: dict) -> list[float]:
    """Per workload table, ``Σ_{a ⊆ S} prod_{i∉S} n_i V_a``: the summed variance of its fitted cells,
    from ``V_a`` the summed variance of the fitted coordinates of ``U_a`` (``{a: V_a}``; a set
    missing counts 0: the fit does not move there)."""
    return [float(sum(outside * float(set_variances.get(a, 0.0)) for a, outside in _table_sets(workload, t)))
            for t in workload.tables]


def identity_l2_variances(workload, x: np.ndarray, free: np.ndarray, variance: float, total: str = "moving",
                          y: np.ndarray | None = None) -> list[float]:
    """Per workload table, the summed variance of its fitted cells ``Σ_c Var (T x̂)_c`` for least
    squares under ``x >= 0`` on one identity measurement, linearised on the face it lands on (the
    Jacobians of :func:`identity_l2_risks`, ``A`` the cells on the fit's face, :func:`identity_face`
    from the noisy histogram ``y``, or the cells with ``x > 0`` when ``y`` is None; ``a_c = |A ∩ c|``
    the face's cells a table cell sums): ``Σ_c a_c`` with the total free;
    ``Σ_c a_c + (n − |A|) a_c² / |A|²`` held at ``Σ y`` (moving); ``Σ_c a_c − a_c² / |A|`` held at a
    value that does not move."""
    x = np.asarray(x, dtype=np.float64)
    active = identity_face(y, x, free, total) if y is not None else np.asarray(free, dtype=bool) & (x > 0)
    size = float(active.sum())
    if not size:
        return [float("nan")] * len(workload.tables)
    out = []
    for t in workload.tables:
        a = t.query(workload.domain).matvec(active.astype(np.float64))
        if total == "moving":
            v = a.sum() + (x.size - size) * float(a @ a) / size**2
        elif total == "fixed":
            v = a.sum() - float(a @ a) / size
        else:
            v = a.sum()
        out.append(float(variance * v))
    return out


def absolute_risks(workload, risks: list[TableRisk], variances: list[float]) -> np.ndarray:
    """The expected absolute error of each workload table, ``E Σ_c |(T x̂)_c − (T x)_c|``, estimated
    from its squared-error risk estimate ``R̂_T`` (:func:`table_risks`) and the summed variance
    ``V_T`` of its fitted cells (:func:`table_variances`, :func:`identity_l2_variances`).

    Each cell's error is read as ``b_c + Z_c``, ``Z_c ~ N(0, V_T / C)`` over the table's ``C`` cells,
    with the table's mean squared bias ``β = (R̂_T − V_T) / C`` in every cell (``R̂_T`` estimates
    ``Σ_c b_c² + V_T``), so ``E Σ_c |e_c| ≈ C · folded_mean(β, V_T / C)`` (:func:`folded_mean`).
    This is what the benchmark's metric sees and the squared-error risk does not: at equal squared
    error a table whose error is variance (the noisy answers) has ``√(2/π) ≈ 0.80`` times the
    absolute error of one whose error is bias spread evenly. Approximations, each stated: the cells'
    errors Gaussian (sums of many noise draws), the fit linearised (``V_T`` from its Jacobian on the
    face it lands on), the bias spread evenly over a table's cells (a bias concentrated in a few
    cells has less absolute error than this says). Exact in expectation for an affine fit with no
    bias under Gaussian noise up to the second-order term of ``folded_mean`` at ``β̂`` near 0
    (a test checks it against simulation)."""
    cells = np.array([float(t.query(workload.domain).num_rows) for t in workload.tables])
    r = np.array([x.risk for x in risks], dtype=np.float64)
    v = np.maximum(np.asarray(variances, dtype=np.float64), 0.0)
    return cells * folded_mean((r - v) / cells, v / cells)
