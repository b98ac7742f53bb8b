"""Local search for controlled rounding of large product-domain tables, where a MIP finds no points.

All 2-way marginals of a 2^16 table put every cell in 120 rows of width-1 windows: HiGHS did
not find a floor/ceil point for 4,000 such cells in 120 s (issue 24), and its soft points were
70 % above the LP bound. :func:`neighbour_search` starts from the support walk's point (last
fractions rounded by largest remainder within the invariant rows) and improves the true
objective

    Σ_k w_k ‖Q_k x − t_k‖₁ + λ ‖x − x~‖₁

by moves that keep every cell at its floor or ceiling and never change an invariant:

- *one-attribute moves*: a unit goes from a cell to the cell that differs from it in one
  attribute ``a`` only; a marginal over ``T`` changes only if ``a ∈ T`` (two rows);
- *2 × 2 cycles* (the basic moves of Diaconis & Sturmfels, "Algebraic algorithms for sampling
  from conditional distributions", Ann. Statist. 26(1), 1998): ``+1`` on ``(u, v), (u', v')`` and
  ``−1`` on ``(u', v), (u, v')`` of attributes ``a, c``, every other attribute fixed; only the
  marginals holding both ``a`` and ``c`` change (four rows), so one marginal's rounding can be
  changed without upsetting the others.

Gains are exact and vectorised over the cells; each sweep applies the improving moves in order
of gain, skipping those that share a row with one applied before them in the sweep.
"""

from __future__ import annotations

import numpy as np

__all__ = ["neighbour_search"]

#: A sweep of :func:`neighbour_search` keeps this many of the best moves of each kind (attribute
#: and shift): moves of one kind mostly share rows, and one applied makes the others wait for
#: the next sweep anyway.
MOVES_PER_KIND = 64


def neighbour_search(b: np.ndarray, up_cost: np.ndarray, coords: np.ndarray, sizes, families: list[tuple[int, ...]],
                     values: list[np.ndarray], targets: list[np.ndarray], weights: list[float], fixed_axes: set[int],
                     deadline=None, max_sweeps: int = 200) -> tuple[np.ndarray, dict]:
    """Improve ``b`` (0/1 over every free cell of a product domain) by moving one unit along one attribute.

    A move takes one unit from cell ``j`` to the cell ``i`` that differs from it in attribute
    ``a`` only. A family over attributes ``T`` with ``a ∉ T`` holds ``i`` and ``j`` in the same
    row and does not change; a family with ``a ∈ T`` has one row up and one down. So a move
    touches ``2 ×`` (families over ``a``) rows instead of every family's, which lets the search
    fix a row's rounding without upsetting the others. Attributes in ``fixed_axes`` (those of
    invariant families) never move, so every invariant holds throughout.

    Each sweep evaluates every move exactly (vectorised over cells and attribute values), then
    applies the improving ones in order of gain, skipping any that touches a row an earlier move
    of the sweep changed (their gains would be stale); sweeps repeat until none improves.

    Parameters
    ----------
    b : ndarray of 0/1, shape (k,)
    up_cost : ndarray, shape (k,)
        Change of the objective's cell term when a cell goes from 0 to 1.
    coords : int array, shape (k, d)
        The cells' attribute codes; the cells must be every cell of the domain (``k = Π sizes``),
        in C order.
    families : list of tuple of int
        The axes of every measured family; ``values``, ``targets`` and ``weights`` per family.
    fixed_axes : set of int

    Returns
    -------
    (b, info) with ``info = {"sweeps": int, "moves": int, "gain": float}``.
    """
    b = np.array(b, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.int64)
    d = sizes.size
    k = b.size
    labels = [np.ravel_multi_index(coords[:, list(f)].T, sizes[list(f)]) if f else np.zeros(k, np.int64)
              for f in families]
    values = [np.array(v, dtype=np.float64) for v in values]
    strides = np.array([int(np.prod(sizes[a + 1:], dtype=np.int64)) for a in range(d)])
    moves = sweeps = 0
    gain_total = 0.0
    for _ in range(max_sweeps):
        if deadline is not None and deadline.expired():
            break
        up_rows = [w * (np.abs(v + 1 - t) - np.abs(v - t)) for v, t, w in zip(values, targets, weights)]
        dn_rows = [w * (np.abs(v - 1 - t) - np.abs(v - t)) for v, t, w in zip(values, targets, weights)]
        cands = []  # (gain, plus cells (n, 1 or 2), minus cells, moved axes)
        ones = np.flatnonzero(b > 0.5)  # every move takes a unit from a cell at its ceiling
        codes = coords[ones]

        def moved(cells, cell_codes, a, shift):
            return cells + ((cell_codes[:, a] + shift) % sizes[a] - cell_codes[:, a]) * strides[a]

        for a in range(d):
            if a in fixed_axes or sizes[a] < 2:
                continue
            for shift in range(1, int(sizes[a])):
                i = moved(ones, codes, a, shift)  # the unit goes from j (in ones) to i
                ok = b[i] < 0.5
                if ok.any():
                    _collect(cands, (a,), i[ok][:, None], ones[ok][:, None], up_cost, families, labels,
                             up_rows, dn_rows)
        for a in range(d):
            for c_ in range(a + 1, d):
                if a in fixed_axes or c_ in fixed_axes or not any(a in f and c_ in f for f in families):
                    continue
                # 2 x 2 cycles (Diaconis & Sturmfels 1998): +1 on (u, v), (u', v'), -1 on (u', v), (u, v'),
                # enumerated from the corner (u', v) among the cells at their ceiling.
                for sa in range(1, int(sizes[a])):
                    for sc in range(1, int(sizes[c_])):
                        i10 = ones
                        i00 = moved(ones, codes, a, sa)
                        i11 = moved(ones, codes, c_, sc)
                        i01 = i00 + (i11 - i10)
                        ok = (b[i00] < 0.5) & (b[i11] < 0.5) & (b[i01] > 0.5)
                        if ok.any():
                            _collect(cands, (a, c_), np.stack([i00[ok], i11[ok]], 1),
                                     np.stack([i10[ok], i01[ok]], 1), up_cost, families, labels, up_rows, dn_rows)
        sweeps += 1
        if not cands:
            break
        gain = np.concatenate([g for g, _, _, _ in cands])
        plus = [p_ for _, p_, _, _ in cands]
        minus = [m_ for _, _, m_, _ in cands]
        axes = [ax for _, _, _, ax in cands]
        which = np.concatenate([np.full(g.size, n) for n, (g, _, _, _) in enumerate(cands)])
        local = np.concatenate([np.arange(g.size) for g, _, _, _ in cands])
        order = np.argsort(gain, kind="stable")
        used = np.zeros(k, bool)
        touched = [np.zeros(v.size, bool) for v in values]
        applied = 0
        changed_by = {ax: [f for f, fam in enumerate(families) if all(x in fam for x in ax)] for ax in set(axes)}
        for m in order:  # the improving moves of a sweep (at most MOVES_PER_KIND of each kind), not the cells
            n, r = which[m], local[m]
            up, down = plus[n][r], minus[n][r]
            if used[up].any() or used[down].any():
                continue
            changed = changed_by[axes[n]]
            if any(touched[f][labels[f][up]].any() or touched[f][labels[f][down]].any() for f in changed):
                continue  # its rows moved in this sweep: the next sweep prices it afresh
            # The gain again, from the current row values (earlier moves of this sweep may share
            # rows). In a changed family the moved cells lie in distinct rows, so the rows' changes
            # add up.
            g = float(up_cost[up].sum() - up_cost[down].sum())
            for f in changed:
                v, t, lab = values[f], targets[f], labels[f]
                ru, rd = lab[up], lab[down]
                g += weights[f] * float(np.abs(v[ru] + 1.0 - t[ru]).sum() - np.abs(v[ru] - t[ru]).sum()
                                        + np.abs(v[rd] - 1.0 - t[rd]).sum() - np.abs(v[rd] - t[rd]).sum())
            if g >= -1e-9:
                continue
            used[up] = True
            used[down] = True
            b[up], b[down] = 1.0, 0.0
            for f in changed:
                values[f][labels[f][up]] += 1.0
                values[f][labels[f][down]] -= 1.0
                touched[f][labels[f][up]] = True
                touched[f][labels[f][down]] = True
            gain_total += g
            applied += 1
        moves += applied
        if applied == 0:
            break
    return b, {"sweeps": sweeps, "moves": moves, "gain": gain_total}


def _collect(cands, axes, plus, minus, up_cost, families, labels, up_rows, dn_rows) -> None:
    """Append the improving moves among ``plus`` (cells up) and ``minus`` (cells down) with their gains.

    Only the families holding every moved axis change (the others see one unit leave and one
    enter the same row).
    """
    g = up_cost[plus].sum(axis=1) - up_cost[minus].sum(axis=1)
    for f, fam in enumerate(families):
        if all(a in fam for a in axes):
            g = g + up_rows[f][labels[f][plus]].sum(axis=1) + dn_rows[f][labels[f][minus]].sum(axis=1)
    good = np.flatnonzero(g < -1e-9)
    if good.size > MOVES_PER_KIND:
        good = good[np.argpartition(g[good], MOVES_PER_KIND - 1)[:MOVES_PER_KIND]]
    if good.size:
        cands.append((g[good], plus[good], minus[good], axes))
