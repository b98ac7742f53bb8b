"""How accurate a release is: before data (from the plan) and after (from the fit).

Two figures per released table, both in the units of the answers (counts):

**Expected error before data.** Measure queries ``Q_i`` with independent noise of variance
``σ_i²`` and fit by weighted least squares; the fit's answers to a table ``A`` have covariance
``A (Σ_i Q_iᵀQ_i / σ_i²)⁺ Aᵀ`` (Li, Hay, Rastogi, Miklau, McGregor, PODS 2010, Prop. 4, with the
weights of generalized least squares). :func:`planned_accuracy` gives each measured table's root
mean squared error per cell from that formula — data-free, so ``dpopt check`` can print it —
next to the noise standard deviation of its own noisy answers. It ignores the constraints:
invariants and non-negativity only lower the error of a least-squares fit, so it is an upper
figure for that fit (not for other objectives).

**Error bars after the fit (active-bound method).** With non-negativity active on many cells
the released estimate is a projection, linear on each piece of its active set: given the cells
held at 0, the inequality rows at a bound, the structural zeros and the invariants, the fit's
covariance is the equality-constrained GLS covariance ``N (NᵀHN)⁺ Nᵀ`` over the remaining cells
(Rao, *Linear Statistical Inference*, 4a.9; :mod:`dpopt.estimate.certificates.errorbars`).
:func:`fitted_error_bars` computes each table's root mean squared standard error per cell from
it without forming the covariance: ``tr(A Cov Aᵀ) = Σ_j z_jᵀ A Cov Aᵀ z_j`` over probe vectors,
each term one conjugate-gradient solve with ``P H P`` (``P`` the projection onto the invariants'
null space). With at most :data:`DIRECT_ROWS` measured rows the same terms come from one
eigendecomposition instead: with ``G = W Q P`` (``W`` the weights ``1/σ``), ``P H P = GᵀG`` and
``bᵀ(GᵀG)⁺b = ‖(GGᵀ)⁺ G b‖²``, where ``GGᵀ`` is only rows × rows (on the quickstart 684 × 684,
4 times faster than the conjugate gradients and equal to 1e-12). Tables of at most :data:`EXACT_PROBE_CELLS` cells use the unit vectors as probes
(exact, every cell's standard error); larger ones use :data:`PROBES` Rademacher probes
(Hutchinson 1990), whose spread gives the estimate's own standard error, printed beside it.
The probes are numerical, not privacy randomness: they come from a fixed seed, so a report is
reproducible, and they touch only the noisy answers' fit. Cells held at a bound get standard
error 0 here although on other noise they might not be at the bound, so the figure is
approximate for tables dominated by small counts; the module notes of
:mod:`~dpopt.estimate.certificates.errorbars` give the parametric bootstrap for exact spread.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dpopt.errors import DpoptError

__all__ = ["planned_accuracy", "fitted_error_bars", "consistency_changes", "PROBES", "EXACT_PROBE_CELLS"]

#: Rademacher probes per table above :data:`EXACT_PROBE_CELLS` cells.
PROBES = 32
#: The fewest probes a table gets when many tables share the solve.
MIN_PROBES = 8
#: Largest probe block (free cells x columns) solved at once: 20M doubles = 160 MB per array.
MAX_BLOCK_ENTRIES = 20_000_000
#: Tables with at most this many cells get exact per-cell standard errors (unit-vector probes).
EXACT_PROBE_CELLS = 64
#: Up to this many measured rows the error bars come from an eigendecomposition of ``G Gᵀ``
#: (module notes); above it, or when its spectrum has no clean gap, from conjugate gradients.
DIRECT_ROWS = 2000
#: Eigenvalues of ``G Gᵀ`` below this (relative to the largest) are its null space ...
DIRECT_RANK_TOL = 1e-10
#: ... and the direct solve is used only when none lies within this factor of that cut-off on
#: either side (a clean gap: marginal systems have their zeros at 1e-16, the rest above 1e-3).
DIRECT_GAP = 1e3
#: Relative residual at which a conjugate-gradient column counts as solved.
CG_TOLERANCE = 1e-7
#: Work bounds of the error-bar solve (every run ends): iterations and seconds.
CG_MAX_ITERATIONS = 2000
ERRORBAR_TIME_LIMIT = 15.0
#: Above this many stacked nonzeros the error bars are not computed (memory of the sparse form).
MAX_ERRORBAR_NONZEROS = 10_000_000
#: Invariant rows above this many are not projected (a dense factor of C Cᵀ).
MAX_INVARIANT_ROWS = 4000


# ---- before data ------------------------------------------------------------------------------------
def planned_accuracy(plan) -> list[dict]:
    """Each planned measurement's expected root mean squared error per answer, before any data.

    Parameters
    ----------
    plan : ReleasePlan
        A plan from :func:`dpopt.release.plan` (nothing of the data is read).

    Returns
    -------
    list of dict
        One row per measured query with a fixed query and a noise law: ``table``, ``answers``,
        ``noise_rmse`` (its own noisy answers: the noise standard deviation) and
        ``expected_rmse`` (the weighted least-squares fit of every measurement, constraints
        ignored; module notes), or ``expected_rmse = None`` with ``why`` when no closed form
        applies (queries over different domains, no structured form, an unsupported table).
    """
    from dpopt.strategy.error import per_query_variance

    steps = [s for s in plan.steps if s.query is not None and s.law is not None and s.law.variance > 0]
    rows = [{"table": s.label, "answers": int(s.query.num_rows), "noise_rmse": float(math.sqrt(s.law.variance)),
             "expected_rmse": None, "why": None} for s in steps]
    if not steps:
        return rows
    if not getattr(getattr(plan, "algorithm", None), "fits_jointly", True):
        for r in rows:
            r["why"] = (f"{plan.algorithm.name} does not fit its measurements in one least-squares problem "
                        "(the closed form does not apply)")
        return rows
    if any(s.query.domain != steps[0].query.domain for s in steps):
        for r in rows:
            r["why"] = "the measurements are over different domains (one fit per level): no joint closed form"
        return rows
    try:
        gram = _weighted_gram([(s.query, s.law.variance) for s in steps])
    except DpoptError as exc:
        for r in rows:
            r["why"] = f"no structured form for the fit's covariance ({exc})"
        return rows
    for s, r in zip(steps, rows):
        try:
            v = per_query_variance(s.query, gram)
        except DpoptError as exc:
            r["why"] = str(exc)
            continue
        r["expected_rmse"] = float(math.sqrt(max(float(np.mean(v)), 0.0)))
    return rows


def _weighted_gram(queries_and_variances):
    """``Σ Q_iᵀQ_i / σ_i²`` in the most structured form the strategy layer knows."""
    from dpopt.strategy.gram import MarginalsGram, SumGram, scaled
    from dpopt.strategy.workload import gram_of

    grams = [scaled(gram_of(q), 1.0 / v) for q, v in queries_and_variances]
    if all(isinstance(g, MarginalsGram) for g in grams):
        return MarginalsGram(grams[0].domain, sum(g.weights for g in grams))
    return grams[0] if len(grams) == 1 else SumGram(grams[0].domain, grams)


# ---- after the fit ----------------------------------------------------------------------------------
@dataclass
class _System:
    """``P H P`` on the free cells: ``H = Σ Q_iᵀQ_i/σ_i²`` and ``P`` the projection onto ``null(C)``."""

    Qw: sp.csr_matrix            # stacked noisy rows / σ, free columns only
    C: sp.csr_matrix | None      # equality rows (invariants, inequalities at a bound), free columns
    CCt_pinv: np.ndarray | None

    def project(self, V: np.ndarray) -> np.ndarray:
        if self.C is None:
            return V
        return V - self.C.T @ (self.CCt_pinv @ (self.C @ V))

    def apply(self, V: np.ndarray) -> np.ndarray:
        return self.project(self.Qw.T @ (self.Qw @ self.project(V)))


def fitted_error_bars(release) -> tuple[list[dict], str | None]:
    """Each measured table's standard error per cell after the fit (active-bound method).

    Returns
    -------
    rows, why
        ``rows``: one dict per noisy measurement with ``table``, ``rmse`` (root mean squared
        standard error per cell), ``rmse_se`` (the probe estimate's own standard error; 0 when
        exact), ``exact`` and ``converged``. ``why`` says, when ``rows`` is empty, why no error
        bars were computed (no least-squares fit, no table, too large).
    """
    rec = release.reconstruction
    problem = getattr(rec, "problem", None)
    if release.counts is None or problem is None:
        return [], ("the released table was not fitted as one least-squares problem (per-unit fits, an iterative "
                    "algorithm, or no table)")
    if problem.objective != "l2":
        return [], (f"the fit's objective is {problem.objective!r}; the analytic error bars describe the weighted "
                    "least-squares (l2) fit")
    if not problem.noisy:
        return [], "no noisy measurement"
    from dpopt.estimate.certificates.errorbars import active_bounds

    info = getattr(rec, "info", None) or {}
    x = np.asarray(info.get("fractional_x", rec.x), dtype=np.float64)
    nnz = problem.domain.size * len(problem.noisy)
    if nnz > MAX_ERRORBAR_NONZEROS:
        return [], f"the stacked measurements have about {nnz:.3g} nonzeros, above the {MAX_ERRORBAR_NONZEROS:.3g} " \
                   "the error-bar solve may hold"
    at_zero, active_rows = active_bounds(problem, x)
    pinned = at_zero.copy()
    if problem.constraints.zero_rules:
        pinned |= problem.constraints.zero_mask()
    free = np.flatnonzero(~pinned)
    if free.size == 0:
        return [dict(table=m.label, answers=m.query.num_rows, rmse=0.0, rmse_se=0.0, exact=True, converged=True)
                for m in problem.noisy], None
    parts = [sp.csr_matrix(m.query.to_sparse(), dtype=np.float64) for m in problem.noisy]
    Qw = sp.vstack([p / m.stddev for p, m in zip(parts, problem.noisy)]).tocsc()[:, free].tocsr()
    A_eq, _, _ = problem.constraints.equality_rows()
    C_rows = [r for r in (sp.csr_matrix(A_eq), sp.csr_matrix(active_rows)) if r.shape[0]]
    C = CCt = None
    if C_rows:
        C = sp.vstack(C_rows).tocsc()[:, free].tocsr()
        C = C[np.flatnonzero(np.asarray(abs(C).sum(axis=1)).ravel() > 0)]
        if C.shape[0] > MAX_INVARIANT_ROWS:
            return [], f"{C.shape[0]} invariant rows bind free cells, above the {MAX_INVARIANT_ROWS} the projection holds"
        CCt = np.linalg.pinv((C @ C.T).toarray(), hermitian=True) if C.shape[0] else None
        C = C if C.shape[0] else None
    system = _System(Qw, C, CCt)
    probes, owners, exact = [], [], []
    # Fewer probes per table when many tables are measured (the average over tables stays sharp).
    probes_per_table = PROBES if len(problem.noisy) <= 16 else max(MIN_PROBES, PROBES * 16 // len(problem.noisy))
    rng = np.random.default_rng(20101)  # numerical probes, fixed for a reproducible report (module notes)
    for i, (m, part) in enumerate(zip(problem.noisy, parts)):
        rows = part.shape[0]
        if rows <= EXACT_PROBE_CELLS:
            Z = np.eye(rows)
            exact.append(True)
        else:
            Z = rng.choice([-1.0, 1.0], size=(rows, probes_per_table))
            exact.append(False)
        probes.append(part.tocsc()[:, free].T @ Z)
        owners.append(np.full(Z.shape[1], i))
    V = np.hstack(probes)
    owners = np.concatenate(owners)
    quad = np.full(V.shape[1], np.nan)
    converged = np.zeros(V.shape[1], dtype=bool)
    chunk = max(1, int(MAX_BLOCK_ENTRIES // max(free.size, 1)))
    deadline = time.monotonic() + ERRORBAR_TIME_LIMIT
    direct = _direct_solver(system) if Qw.shape[0] <= DIRECT_ROWS else None
    for start in range(0, V.shape[1], chunk):  # memory-bounded blocks under one deadline
        block = system.project(V[:, start:start + chunk])
        if direct is not None:
            quad[start:start + chunk] = direct(block)
            converged[start:start + chunk] = True
            continue
        U, done = _block_cg(system, block, deadline)
        quad[start:start + chunk] = np.einsum("ij,ij->j", block, U)
        converged[start:start + chunk] = done
    out = []
    for i, m in enumerate(problem.noisy):
        q = quad[(owners == i) & np.isfinite(quad)]
        rows = m.query.num_rows
        if exact[i]:
            mean, se = float(q.sum()) / rows, 0.0
        else:
            mean, se = float(q.mean()) / rows, float(q.std(ddof=1) / math.sqrt(q.size)) / rows
        rmse = math.sqrt(max(mean, 0.0))
        out.append({"table": m.label, "answers": rows, "rmse": rmse,
                    "rmse_se": se / (2 * rmse) if rmse > 0 else 0.0,  # delta method for the square root
                    "exact": exact[i], "converged": bool(converged[owners == i].all())})
    return out, None


def _direct_solver(system: _System):
    """``B ↦ (bᵀ (P H P)⁺ b)`` per column of ``B`` (projected probes) from the eigendecomposition
    of ``G Gᵀ = W Q P Qᵀ W`` (module notes), or None when its spectrum has no clean gap at
    :data:`DIRECT_RANK_TOL` (the conjugate gradients then decide)."""
    Qw = system.Qw
    M = (Qw @ Qw.T).toarray()
    if system.C is not None:
        QC = np.asarray((Qw @ system.C.T).todense())
        M -= QC @ system.CCt_pinv @ QC.T
    lam, vectors = np.linalg.eigh((M + M.T) / 2)
    top = float(lam.max(initial=0.0))
    if not top > 0:
        return None
    rel = lam / top
    if np.any((rel > DIRECT_RANK_TOL / DIRECT_GAP) & (rel < DIRECT_RANK_TOL * DIRECT_GAP)):
        return None
    keep = rel >= DIRECT_RANK_TOL
    basis, inverse = vectors[:, keep], 1.0 / lam[keep]

    def quadratic_forms(B: np.ndarray) -> np.ndarray:
        Y = (basis.T @ (Qw @ B)) * inverse[:, None]
        return np.einsum("ij,ij->j", Y, Y)

    return quadratic_forms


def _block_cg(system: _System, B: np.ndarray, deadline: float) -> tuple[np.ndarray, np.ndarray]:
    """Conjugate gradients, one column per right-hand side, on the consistent singular system
    ``P H P u = b`` (``b`` in its range: the measured tables lie in the measurements' row space)."""
    X = np.zeros_like(B)
    R = B.copy()
    Pm = R.copy()
    rr = np.einsum("ij,ij->j", R, R)
    target = (CG_TOLERANCE ** 2) * np.maximum(rr, 1e-300)
    done = rr <= target
    for _ in range(CG_MAX_ITERATIONS):
        if done.all() or time.monotonic() > deadline:
            break
        live = np.flatnonzero(~done)
        AP = system.apply(Pm[:, live])
        pap = np.einsum("ij,ij->j", Pm[:, live], AP)
        alpha = np.where(pap > 0, rr[live] / np.where(pap > 0, pap, 1.0), 0.0)
        X[:, live] += alpha * Pm[:, live]
        R[:, live] -= alpha * AP
        rr_new = np.einsum("ij,ij->j", R[:, live], R[:, live])
        beta = rr_new / np.maximum(rr[live], 1e-300)
        Pm[:, live] = R[:, live] + beta * Pm[:, live]
        rr[live] = rr_new
        done[live] = (rr_new <= target[live]) | (pap <= 0)
    return X, done


# ---- what consistency changed ------------------------------------------------------------------------
def consistency_changes(release) -> list[dict]:
    """Per noisy measurement: how far the released table moved its answers from the noisy ones,
    and which constraints were at work (public quantities only: noisy and released answers)."""
    if release.counts is None:
        return []
    x = np.asarray(release.counts, dtype=np.float64)
    rec = release.reconstruction
    info = (getattr(rec, "info", None) or {}) if rec is not None else {}
    fractional = info.get("fractional_x", rec.x if rec is not None and release.rounding is not None else None)
    fractional = None if fractional is None else np.asarray(fractional, dtype=np.float64)
    cs = release.constraints
    out = []
    for m in release.measurements:
        if not m.stddev > 0:
            continue
        released = m.query.matvec(x)
        change = released - m.values
        negative = int(np.count_nonzero(m.values < 0))
        reasons = []
        if len([k for k in release.measurements if k.stddev > 0]) > 1:
            reasons.append("combined with the other measurements (weighted by their noise)")
        if cs.nonnegative and negative:
            reasons.append(f"non-negativity ({negative} noisy answer{'s' if negative > 1 else ''} below 0)")
        held = [inv.name for inv in cs.invariants if _constrains(inv.query, m.query)]
        if held:
            reasons.append("sums held to " + ", ".join(held))
        if cs.zero_rules:
            reasons.append("structural zeros")
        row = {"table": m.label, "answers": int(m.query.num_rows),
               "rms_change": float(np.sqrt(np.mean(change ** 2))),
               "rms_change_in_noise_sd": float(np.sqrt(np.mean(change ** 2)) / m.stddev),
               "max_abs_change": float(np.abs(change).max()) if change.size else 0.0,
               "noisy_negative": negative,
               "rounding_rms_change": None}
        if fractional is not None and fractional.shape == x.shape:
            rounding = released - m.query.matvec(fractional)
            row["rounding_rms_change"] = float(np.sqrt(np.mean(rounding ** 2)))
            if np.any(rounding != 0):
                reasons.append("integer rounding")
        row["why"] = "; ".join(reasons) or "unchanged"
        out.append(row)
    return out


def _constrains(invariant_query, table_query) -> bool:
    """True when an invariant's rows are sums of the table's cells (a marginal of fewer attributes)."""
    inv_attrs = getattr(invariant_query, "attrs", None)
    table_attrs = getattr(table_query, "attrs", None)
    if inv_attrs is None or table_attrs is None:
        return False
    return set(inv_attrs) <= set(table_attrs)
