"""A local repair before the records: each clique's own top residual absorbs its negative cells.

The certificate of :mod:`~dpopt.estimate.marginal_space.polytope.projection` pairs the multipliers
with a feasible point; ADMM's candidate ``x`` (``m = E x``) is consistent with cells slightly
negative, and the records of :mod:`.records` lift each one with a point mass that touches one cell
of *every* clique: on adult's 364 triples that repair, not the complementarity, was most of the
certified gap (issue 27).

**Moves that touch one clique.** The top residual ``c_C`` of a clique ``C`` that no other clique
contains enters the marginal of ``C`` alone, as ``Q_C^T c_C`` (layout notes, equation (1), with
``n_{C∖C} = 1``), and ``Q_C^T`` maps the residual isometrically onto the *top interaction
subspace* ``S_C``: the tables on ``C`` whose every lower margin is zero (``Q_a`` is orthogonal to the
constant vector along each axis). Changing ``c_C`` alone therefore keeps every other clique's cells
and every lower margin of ``C``: the family stays consistent by construction. For each clique with
negative cells this module replaces ``mu_C`` by its Euclidean projection onto

    { v : v - mu_C in S_C,  v >= 0,  v = 0 on structural zeros }                        (12)

and sets ``c_C = Q_C v`` (:func:`~dpopt.estimate.marginal_space.layout.contrast`). The change of (4) is
``W_C/2 (||c_C' - c^_C||² - ||c_C - c^_C||²)``, about ``<kappa_C, v - mu_C>`` near an optimum
(``W_C (c_C - c^_C) = Q_C kappa_C`` there): the lift of the negative cells priced by their own
multipliers, with the mass taken back from the cell's fibres where ``kappa`` is mostly 0. The
records instead also pay ``kappa`` at the cell they touch in every other clique.

**The projection.** The dual of (12) is ``min over lam >= 0 (free on zeros) of 1/2 ||P_S lam||²
+ <lam, mu_C>``, whose gradient is the primal point ``v(lam) = mu_C + P_S lam`` (in the affine
set for every ``lam``) and whose Lipschitz constant is 1, with ``P_S`` the product of the centrings
along each axis (they commute). Projected gradient on this dual is Dykstra's alternating
projection between the affine set and the orthant (Boyle and Dykstra, "A method for finding
projections onto the intersection of convex sets in Hilbert spaces", 1986; Bauschke and Borwein,
SIAM Review 38, 1996, for the convergence), here accelerated by FISTA (Beck and Teboulle, SIAM J.
Imaging Sci. 2, 2009) for :data:`SWEEPS` steps. The point kept is ``v(lam)`` itself, so the
margins hold to rounding whatever the steps; what is still negative goes to the records, which
only add mass. A clique whose negative mass the step does not lower is left as it was.

**Measured** (adult_pgm, zCDP eps 1, seed 7: the 9-attribute stand-in, 84 triples, 2.34 M cells,
and all 14 attributes, 364 triples; ADMM points of
:func:`~dpopt.estimate.marginal_space.polytope.admm.admm`; scripts in the session notes):

===================  ===============  =========================  ============================
ADMM step            complementarity  repair cost: records only  local (100 sweeps) + records
===================  ===============  =========================  ============================
stand-in, 500        235              413 (rel. gap 3.2e-4)      24.6 (rel. gap 1.3e-4)
stand-in, 1,000      27.3             54.7 (rel. gap 4.0e-5)     5.4 (rel. gap 1.6e-5)
364 triples, 300     16,075           107,078 (rel. gap 6.4e-3)  767 (rel. gap 8.8e-4)
===================  ===============  =========================  ============================

(the repair cost is ``F(repaired) - F(r(kappa))``; records priced by ``kappa`` as ADMM prices them).
On the stand-in the negative mass falls from 19.0 to 0.15 (step 1,000) for 2.1 CPU-s (the records
take 4); on all 364 triples of adult (20.9 M cells) from 2,822 to 27.5 for 15 CPU-s (the records
then take 64 CPU-s, against 73 alone).
Anchoring the projection at the clique's *target* ``Q_C^T c^_C`` instead (the exact per-clique
minimiser of (4)) did not converge in hundreds of steps from the noisy target, and projected
Newton on its dual diverged on faces with no feasible solution; they were dropped.
"""

from __future__ import annotations

import numpy as np

from dpopt.estimate.marginal_space.layout import contrast

__all__ = ["SWEEPS", "local_repair", "top_cliques"]

#: FISTA steps on each clique's dual (12): 100 left 0.8 % of the stand-in's negative mass (300: 0.03 %,
#: with the same certified gap to 1 %).
SWEEPS = 100


def top_cliques(problem) -> list[int]:
    """The cliques (positions in ``problem.cliques.sets``) whose own top residual is free and held
    by no other clique (``D_C = 1``): the ones :func:`local_repair` may move."""
    fam, index = problem.cliques, problem.index
    diagonal = fam.diagonal()
    out = []
    for i, axes in enumerate(fam.sets):
        if not axes:
            continue
        p = index.position_of(axes)
        if problem.fixed[p] or abs(diagonal[p] - 1.0) > 1e-12:
            continue
        out.append(i)
    return out


def local_repair(problem, x: np.ndarray, m: np.ndarray, sweeps: int = SWEEPS, floor: float = 0.0) -> int:
    """Replace, **in place**, the top residual of every clique of :func:`top_cliques` with negative
    cells by the projection (12) (module notes); returns the number of cliques changed.

    ``x`` are residuals and ``m = E x`` their clique marginals; afterwards ``m = E x`` still holds
    (to rounding), only the changed cliques' cells and top residuals differ, and their lower
    margins are the same. A clique is changed only when that lowers its negative mass
    (structural zeros aside) without moving a structural zero further from 0. Cliques whose cells
    are all at least ``-floor`` are left alone (rounding-level signs).
    """
    if not problem.nonnegative:
        return 0
    fam, index, sizes, zeros = problem.cliques, problem.index, problem.index.sizes, problem.zero_cells
    changed = 0
    for i in top_cliques(problem):  # a loop over cliques; each one's cells are whole-array operations
        part = slice(fam.offsets[i], fam.offsets[i] + fam.cells[i])
        cells = m[part]
        zero = None if zeros is None else zeros[part]
        low = cells < 0 if zero is None else (cells < 0) & ~zero
        if not low.any() or cells[low].min() >= -floor:
            continue
        shape = tuple(int(sizes[a]) for a in fam.sets[i])
        p = index.position_of(fam.sets[i])
        block = slice(index.set_offsets[p], index.set_offsets[p] + index.set_cells[p])
        mu = cells.reshape(shape)
        v = mu + _interaction(_dual(mu, None if zero is None else zero.reshape(shape), sweeps))
        top = contrast(v).ravel()
        new = v.ravel()  # v - mu lies in S_C, where Q_C^T Q_C is the identity: E x' on C is v (to rounding)
        after = new < 0 if zero is None else (new < 0) & ~zero
        kept_zeros = zero is None or np.abs(new[zero]).max(initial=0.0) <= np.abs(cells[zero]).max(initial=0.0)
        if kept_zeros and -float(new[after].sum()) < -float(cells[low].sum()):
            x[block] = top
            m[part] = new
            changed += 1
    return changed


def _dual(mu: np.ndarray, zero: np.ndarray | None, sweeps: int) -> np.ndarray:
    """FISTA on the dual of (12) from ``lam = 0``: step 1 (the Lipschitz constant), ``lam >= 0``
    except on structural zeros (equalities: free)."""
    lam = np.zeros_like(mu)
    ahead, theta = lam, 1.0
    for _ in range(sweeps):
        following = ahead - (mu + _interaction(ahead))  # a gradient step: the gradient is v(ahead)
        if zero is None:
            np.maximum(following, 0.0, out=following)
        else:
            following = np.where(zero, following, np.maximum(following, 0.0))
        theta_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * theta * theta))
        ahead = following + ((theta - 1.0) / theta_next) * (following - lam)
        lam, theta = following, theta_next
    return lam


def _interaction(v: np.ndarray) -> np.ndarray:
    """``P_S v``: the orthogonal projection onto the top interaction subspace (every lower margin
    zero), the centring along every axis in turn."""
    out = v
    for axis in range(v.ndim):
        out = out - out.mean(axis=axis, keepdims=True)
    return out
