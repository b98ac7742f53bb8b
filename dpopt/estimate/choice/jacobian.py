"""Exact Jacobians of the fitted answers with respect to the noisy ones, for Stein's risk estimate.

Both estimators are fitted to one whitened measurement ``d = C x + z`` (unit variance per row;
:meth:`~dpopt.estimate.choice.statistics.ResidualStatistics.measurement`), optionally with the
table's total held at its estimate ``N̂ = d_∅ / w_∅`` (``w_∅`` the weight of the total's row) and
public equality rows. What Stein's unbiased risk estimate needs is the diagonal of
``J = ∂(C x̂)/∂d`` (:mod:`dpopt.estimate.choice.risk`). Everything is ``m × m`` linear algebra in
the rows (``m`` residual coordinates), with ``C diag(v) Cᵀ`` from the query's weighted Gram (one
Walsh–Hadamard transform on binary domains); no matrix over the cells is formed, and nothing is
random (no probing vectors).

**Least squares under x ≥ 0** (:func:`projection_jacobian`). Locally the fit is the Euclidean
projection of ``d`` onto the face ``{C x : x_j = 0 off F, E x = e(d)}`` of the cone of feasible
answers, ``F`` the cells the fit leaves free (:func:`fitted_face`: by the KKT conditions, not by a
threshold on the cells' size; Meyer and Woodroofe 2000; Tibshirani and
Taylor 2012: the divergence of a projection onto a polyhedron is the dimension of the face it
lands on, almost everywhere). With ``R_F = [C; E]`` restricted to ``F``, ``A``, ``B`` the rows of
``G_F = R_F R_Fᵀ`` belonging to ``C`` and to ``E``, ``N`` a basis of ``null(B)`` and ``P`` the
projector onto ``range(A N)``:

    J = P + (I − P) A B⁺ ∂e/∂d,

so ``trace J`` is the face's dimension (``rank(A N)``) plus the held total's term.

**The smooth estimate** (:func:`smooth_jacobian`). Step ``k`` of
:mod:`dpopt.estimate.engines.smooth` is ``x_k = x_{k−1} ∘ exp(−Rᵀ ξ_k / λ)`` with
``R x_k − t(d) − V ξ_k = 0`` (``V`` the identity on measured rows, 0 on equality rows, ``t`` the
targets). Differentiating, with ``D_k = diag(x_k)``, ``G_k = R D_k Rᵀ`` and
``∂ log x_k / ∂d = Rᵀ Λ_k``:

    ∂ξ_k = (G_k / λ + V)⁻¹ (G_k Λ_{k−1} − ∂t/∂d),     Λ_k = Λ_{k−1} − ∂ξ_k / λ,

starting from ``Λ_0`` (the uniform prior scales with ``N̂``: ``∂ log p = 1 ∂N̂ / N̂``, and ``1`` is
the held total's row of ``R``). Then ``J = C D_K Rᵀ Λ_K = (G_K)_{C,·} Λ_K``.

**Cells held at 0 and redundant rows.** An equality row with a fixed target of 0 and
coefficients of one sign (a state whose published total is 0) holds its cells at 0 whatever
``d``; the smooth engine leaves them at rounding size (~1e-17), and their row of ``G_k`` is then
of that size too, so ``G_k / λ + V`` is singular to rounding (rcond ~1e-17; the same for a row
that repeats others, a total beside the state totals it sums). The Jacobian is the limit as
those cells go to 0, where they drop out: the solve runs on the cells that move, with the
equality rows replaced by an orthonormal basis ``Wᵀ E`` of their span there
(:func:`_equality_basis`), a positive-definite system solved by Cholesky after a symmetric
diagonal scaling. On the audit of ``quickstart_auto`` this gives the same Jacobians as the
singular solve did (to 1e-16) without its warnings; a test checks it against finite differences.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.linalg as la
import scipy.sparse as sp

from dpopt.errors import SolverError
from dpopt.model.queries import LinearQuery
from dpopt.model.queries.explicit import SparseQuery

__all__ = ["DenseRows", "EqualityRows", "fitted_face", "projection_jacobian", "smooth_jacobian"]


class DenseRows(SparseQuery):
    """A query's rows held as one dense ``m × n`` array (small ``m² n``: the audit's tiny domains).

    Its weighted Gram ``Q diag(v) Qᵀ`` is one BLAS product, offered as a fast weighted Gram so
    that the smooth engine's Newton systems and the Jacobians use it; products with ``Q`` and
    ``Qᵀ`` are dense too. The same rows as ``query``: results agree to rounding.
    """

    fast_weighted_gram = True

    def __init__(self, query: LinearQuery) -> None:
        super().__init__(query.domain, query.to_sparse())
        self.dense = self.matrix.toarray()

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.dense @ x

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self.dense.T @ y

    def _weighted_gram(self, v: np.ndarray) -> np.ndarray:
        return (self.dense * v[None, :]) @ self.dense.T


class EqualityRows:
    """The equality rows ``E`` beside the measured rows: the held total (its target ``d_∅ / w_∅``
    moves with ``d``) and public invariants (fixed targets).

    Parameters
    ----------
    queries : sequence of LinearQuery
        The equality rows, stacked.
    total_row : int or None
        Position, among the stacked equality rows, of the held total (None: none held).
    total_source : tuple (int, float) or None
        ``(i, w)``: the held total is ``d_i / w`` (the measured row of the total and its weight);
        None when it does not move with ``d`` (held at a public value, or at the floor of its
        standard error because the measured total is within noise of zero).
    """

    def __init__(self, queries: Sequence[LinearQuery] = (), total_row: int | None = None,
                 total_source: tuple[int, float] | None = None, values: np.ndarray | None = None) -> None:
        self.queries = list(queries)
        self.matrix = sp.vstack([sp.csr_matrix(q.to_sparse()) for q in self.queries]).tocsr() if self.queries \
            else None
        self.count = 0 if self.matrix is None else self.matrix.shape[0]
        self.total_row = total_row
        self.total_source = total_source
        self.values = None if values is None else np.asarray(values, dtype=np.float64).ravel()
        if total_source is not None and total_row is None:
            raise SolverError("EqualityRows: a moving total needs the row it is held on")
        if self.values is not None and self.values.size != self.count:
            raise SolverError(f"EqualityRows: {self.values.size} values for {self.count} equality rows")

    def pinned_cells(self, num_cells: int) -> np.ndarray:
        """The cells that ``x >= 0`` and the equality rows hold at exactly 0 whatever ``d``: those a
        row with a fixed target of 0 and coefficients of one sign covers (a state whose published
        total is 0). Boolean over the cells (all False without ``values``)."""
        out = np.zeros(num_cells, dtype=bool)
        if self.values is None or self.matrix is None:
            return out
        E = self.matrix
        for i in np.flatnonzero(self.values == 0):
            if self.total_source is not None and i == self.total_row:
                continue  # its target moves with d
            row = E.getrow(i)
            if row.nnz and (np.all(row.data >= 0) or np.all(row.data <= 0)):
                out[row.indices] = True
        return out

    def target_derivative(self, m: int) -> np.ndarray:
        """``∂t/∂d`` for the measured rows then the equality rows: ``(m + e) × m``."""
        out = np.zeros((m + self.count, m))
        out[:m] = np.eye(m)
        if self.total_source is not None:
            i, w = self.total_source
            out[m + self.total_row, i] = 1.0 / w
        return out


def _gram(query: LinearQuery, E, v: np.ndarray) -> np.ndarray:
    """``R diag(v) Rᵀ`` for ``R = [query; E]`` (``E`` sparse, or None for no equality rows)."""
    top = query.weighted_gram(v) if getattr(query, "fast_weighted_gram", False) else \
        np.asarray((sp.csr_matrix(query.to_sparse()).multiply(v[None, :]) @ sp.csr_matrix(query.to_sparse()).T).todense())
    if E is None or E.shape[0] == 0:
        return top
    cross = np.column_stack([query.matvec(v * E[i].toarray().ravel()) for i in range(E.shape[0])])
    corner = np.asarray((E.multiply(v[None, :]) @ E.T).todense())
    return np.block([[top, cross], [cross.T, corner]])


def fitted_face(query: LinearQuery, values: np.ndarray, x: np.ndarray, free: np.ndarray,
                eq: EqualityRows | None = None, rounds: int = 5) -> np.ndarray:
    """The cells least squares under ``x >= 0`` leaves free: the face :func:`projection_jacobian` needs.

    The fit is ``min ½‖C x − d‖²`` over ``x >= 0`` on the ``free`` cells with ``E x = e``
    (``query`` = ``C``, ``values`` = ``d``, ``eq`` = ``E``). At its solution the reduced gradient
    ``μ = Cᵀ(C x − d) + Eᵀν`` (``ν`` the equality multipliers) vanishes on the free face and is
    ``≥ 0`` on the cells at 0 (the KKT conditions the solver certified). A cell is on the face when
    its diagonally scaled projected-gradient step keeps it off its bound,

        x_j > u_j² μ_j,     u_j = 1/‖C_j‖ (the cell's noise unit, whitened rows),

    the identification of the active set by the projected step ``[x − D ∇f]_+`` with the diagonal
    ``D = diag(u²)`` (Bertsekas 1982, projected Newton methods for simple constraints; ``x_j`` and
    ``u_j² μ_j`` are the natural residual's two arms). Both sides are in counts, so the rule has no
    relative threshold: a cell the solver left at 8e-8 beside cells of 50, with a multiplier of half
    a noise unit, is at its bound, and a genuinely small positive cell (``μ_j`` at rounding size)
    is free. The two sides are within the certified stationarity residual of each other only at a
    degenerate point (a cell at 0 with a zero multiplier), which continuous noise reaches with
    probability 0. ``ν`` is the noise-unit-weighted least-squares fit
    ``min Σ_{j∈F} u_j² (g_j + (Eᵀν)_j)²`` on the face ``F``, which is refitted until the face stops
    changing (at most ``rounds`` times; the first ``F`` the cells with ``x > 0``). Cells a zero-target equality row pins
    (:meth:`EqualityRows.pinned_cells`) are never on the face.

    Parameters
    ----------
    query : LinearQuery
        ``C`` (the whitened rows the fit is least squares on).
    values : ndarray
        ``d``.
    x : ndarray
        The certified fit.
    free : ndarray of bool
        The cells no structural zero fixes.
    eq : EqualityRows, optional
        The equality rows (the held total, invariants).

    Returns
    -------
    ndarray of bool
    """
    x = np.asarray(x, dtype=np.float64)
    free = np.asarray(free, dtype=bool)
    g = np.asarray(query.rmatvec(query.matvec(x) - np.asarray(values, dtype=np.float64)), dtype=np.float64)
    h = np.broadcast_to(np.asarray(query.column_norm_powers(2), dtype=np.float64), x.shape)
    unit2 = np.where(h > 0, 1.0 / np.where(h > 0, h, 1.0), np.inf)  # an unmeasured cell: never pushed to 0
    if eq is not None:
        free = free & ~eq.pinned_cells(x.size)  # held at 0 by a zero-target row: never free
    face = free & (x > 0)
    E = None if eq is None or eq.matrix is None or eq.count == 0 else sp.csr_matrix(eq.matrix)
    for _ in range(rounds):
        mu = g
        if E is not None and face.any():
            EF = E[:, np.flatnonzero(face)]
            w = np.where(np.isfinite(unit2[face]), unit2[face], 0.0)
            normal = np.asarray((EF.multiply(w[None, :]) @ EF.T).todense())
            nu = np.linalg.lstsq(normal, -np.asarray(EF @ (w * g[face])).ravel(), rcond=None)[0]
            mu = g + np.asarray(E.T @ nu).ravel()
        with np.errstate(invalid="ignore"):
            step = np.where(np.isfinite(unit2), unit2 * mu, -np.inf)
        new = free & (x > 0) & (x > step)
        if np.array_equal(new, face):
            break
        face = new
    return face


def projection_jacobian(query: LinearQuery, eq: EqualityRows, positive: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """``∂(C x̂)/∂d`` of least squares under ``x >= 0`` on the face of the cells ``positive``
    (boolean over the cells, :func:`fitted_face`; module notes). ``tol`` is the relative rank
    threshold of the singular values (numerical rank), not a threshold on the cells."""
    m = query.num_rows
    G = _gram(query, eq.matrix, positive.astype(np.float64))
    A, B = G[:m], G[m:]
    if B.shape[0]:
        _, s, vt = la.svd(B, full_matrices=True)
        rank_b = int(np.sum(s > tol * max(float(s.max(initial=0.0)), 1e-300)))
        N = vt[rank_b:].T
        B_pinv = la.pinv(B, atol=tol * max(float(s.max(initial=0.0)), 1e-300))
    else:
        N = np.eye(G.shape[1])
        B_pinv = np.zeros((G.shape[1], 0))
    AN = A @ N
    u, s, _ = la.svd(AN, full_matrices=False)
    rank = int(np.sum(s > tol * max(float(s.max(initial=0.0)), 1e-300)))
    U = u[:, :rank]
    P = U @ U.T
    J = P
    if B.shape[0]:
        dt = eq.target_derivative(m)[m:]            # e x m
        J = J + (np.eye(m) - P) @ (A @ (B_pinv @ dt))
    return J


def _equality_basis(eq: EqualityRows, moving: np.ndarray):
    """``(E', W)``: the equality rows reduced to the cells that move, ``E' = Wᵀ E`` restricted to
    ``moving``, with ``W`` (``e × r``) an orthonormal basis of the row combinations that are not 0
    there (the eigenvectors of ``E_F E_Fᵀ`` with a positive eigenvalue, ``F`` the moving cells):
    rows left empty (a state whose published total is 0) or dependent (a total beside the state
    totals it sums) are dropped. ``W`` is the identity, and ``E'`` the rows themselves, when no row
    is lost; ``E'`` is None when none is left."""
    E = eq.matrix[:, np.flatnonzero(moving)]
    gram = np.asarray((E @ E.T).todense(), dtype=np.float64)
    values, vectors = np.linalg.eigh(gram)
    top = float(values.max(initial=0.0))
    keep = values > 1e-10 * top if top > 0 else np.zeros(values.size, dtype=bool)
    if keep.all():  # no row lost: the rows themselves (the cells that do not move get weight 0)
        return eq.matrix, np.eye(eq.count)
    W = vectors[:, keep]
    return (sp.csr_matrix(W.T) @ eq.matrix.multiply(moving[None, :].astype(np.float64))).tocsr() if W.shape[1] \
        else None, W


def smooth_jacobian(query: LinearQuery, eq: EqualityRows, iterates: Sequence[np.ndarray], lam: float,
                    prior_scales_with_total: bool, cells: bool = False):
    """``∂(C x_K)/∂d`` of the ``K``-step smooth estimate (module notes).

    Cells that stay at 0 whatever ``d`` (structural zeros, and cells a zero-target equality row
    pins, :meth:`EqualityRows.pinned_cells`) are left out, with the equality rows that are then
    empty or dependent (:func:`_equality_basis`): the smooth engine leaves such cells at rounding
    size, not 0, and their rows made ``G / λ + V`` singular to rounding (rcond ~1e-17) though the
    Jacobian, the limit as those cells go to 0, does not depend on them. The reduced system is
    positive definite and solved by Cholesky after a symmetric diagonal scaling.

    Parameters
    ----------
    iterates : sequence of ndarray
        The first prior then ``x_1 .. x_K`` (``info["iterates"]`` of the smooth engine).
    lam : float
        ``λ`` in the units of the counts.
    prior_scales_with_total : bool
        Whether the first prior is uniform with the held total ``N̂`` (so it moves with ``d``).
    cells : bool or ndarray
        True: also return ``∂x_K/∂d = D_K Rᵀ Λ_K`` (``n × m``, 0 on the cells that do not move): what
        the fit does to coordinates it does not fit (the top-order interactions of a fit of the lower
        orders), for their variance (:func:`~dpopt.estimate.choice.risk.absolute_risks`). A vector
        ``v`` over the cells: also return ``(∂x_K/∂d)ᵀ v = Λ_Kᵀ R (x_K ⊙ v)`` (length ``m``, by the
        query's own product: no explicit rows), for the gradient of a risk estimate.

    Returns
    -------
    ndarray, or (ndarray, ndarray) with ``cells``
    """
    m = query.num_rows
    if len(iterates) < 2:
        raise SolverError("smooth_jacobian: no step to differentiate")
    n = np.asarray(iterates[0]).size
    moving = ~eq.pinned_cells(n)
    for x in iterates[1:]:
        moving &= np.asarray(x) > 0
    dt_full = eq.target_derivative(m)
    lam_full = np.zeros((m + eq.count, m))
    if prior_scales_with_total and eq.total_source is not None:
        i, w = eq.total_source
        total = float(np.sum(iterates[0]))
        lam_full[m + eq.total_row, i] = 1.0 / (w * total)
    E, W = (None, np.zeros((0, 0))) if eq.matrix is None else _equality_basis(eq, moving)
    e = 0 if E is None else E.shape[0]
    # Λ and ∂t/∂d in the reduced equality coordinates (Eᵀ W Wᵀ = Eᵀ on the moving cells).
    Lam = np.vstack([lam_full[:m], W.T @ lam_full[m:]]) if eq.count else lam_full
    dt = np.vstack([dt_full[:m], W.T @ dt_full[m:]]) if eq.count else dt_full
    V = np.concatenate([np.ones(m), np.zeros(e)])
    G = None
    for x in iterates[1:]:
        G = _gram(query, E, np.where(moving, np.asarray(x, dtype=np.float64), 0.0))
        H = G / lam + np.diag(V)
        rhs = G @ Lam - dt
        scale = 1.0 / np.sqrt(np.maximum(np.diag(H), 1e-300))
        try:
            factor = la.cho_factor(H * scale[:, None] * scale[None, :])
            step = scale[:, None] * la.cho_solve(factor, scale[:, None] * rhs)
        except la.LinAlgError:
            step = np.linalg.lstsq(H, rhs, rcond=None)[0]
        Lam = Lam - step / lam
    if cells is False:
        return G[:m] @ Lam
    x = np.where(moving, np.asarray(iterates[-1], dtype=np.float64), 0.0)
    if cells is not True:
        u = x * np.asarray(cells, dtype=np.float64)
        product = Lam[:m].T @ query.matvec(u)
        if E is not None and e:
            product = product + Lam[m:].T @ np.asarray(E @ u).ravel()
        return G[:m] @ Lam, product
    back = np.asarray(sp.csr_matrix(query.to_sparse()).T @ Lam[:m])
    if E is not None and e:
        back = back + np.asarray(E.T @ Lam[m:])
    return G[:m] @ Lam, x[:, None] * back
