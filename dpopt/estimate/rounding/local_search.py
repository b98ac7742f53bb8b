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
  changed without upsetting the others;
- *swaps*: a unit from any cell at its ceiling to any cell at its floor that agrees with it on
  the invariants' attributes (and, with no invariant, a unit added or removed alone). On a table
  whose cells are mostly at their floor (a least-squares fit is 0 on most of nltcs's 2^16 cells)
  the moves above find few cells to act on; a swap's gain is the sum of what the unit's removal
  and its insertion gain alone, corrected on the rows the two cells share, so the best of
  ``SWAP_CANDIDATES²`` pairs are priced exactly at the cost of one pass over the cells. They are
  tried only where the other moves find nothing (on nltcs's least-squares fit they found no
  improving swap there either: a unit moved between unrelated cells changes about 200 answers).

Gains are exact and vectorised over the cells; each sweep applies the improving moves in order
of gain, skipping those that share a row with one applied before them in the sweep (applying
those too, re-priced, reached worse local optima on nltcs: gap 0.30 against 0.25).
"""

from __future__ import annotations

import numpy as np

__all__ = ["neighbour_search"]

#: A sweep of :func:`neighbour_search` keeps this many of the best moves of each kind (attribute
#: and shift): moves of one kind mostly share rows, and one applied makes the others wait for
#: the next sweep anyway.
MOVES_PER_KIND = 64
#: The swaps of a sweep pair this many best cells to raise with as many best cells to lower.
SWAP_CANDIDATES = 256


def neighbour_search(b: np.ndarray, up_cost: np.ndarray, coords: np.ndarray, sizes, families: list[tuple[int, ...]],
                     values: list[np.ndarray], targets: list[np.ndarray], weights: list[float], fixed_axes: set[int],
                     deadline=None, max_sweeps: int = 200, *, keep_total: bool = True) -> tuple[np.ndarray, dict]:
    """Improve ``b`` (0/1 over every free cell of a product domain) by moves of a unit between cells.

    A one-attribute move takes one unit from cell ``j`` to the cell ``i`` that differs from it
    in attribute ``a`` only. A family over attributes ``T`` with ``a ∉ T`` holds ``i`` and ``j``
    in the same row and does not change; a family with ``a ∈ T`` has one row up and one down.
    2 × 2 cycles change only the families holding both their attributes; swaps move a unit
    between any two cells that agree on ``fixed_axes`` (see the module notes). Attributes in
    ``fixed_axes`` (those of invariant families) never move, so every invariant holds throughout.

    Each sweep evaluates every move exactly (vectorised over cells and attribute values), then
    applies the improving ones in order of gain, skipping any that touches a row an earlier move
    of the sweep changed; sweeps repeat until none improves.

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
    keep_total : bool
        False when no invariant holds the table's total: a unit may then be added or removed alone.

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
    fixed = sorted(fixed_axes)
    group = np.ravel_multi_index(coords[:, fixed].T, sizes[fixed]) if fixed else np.zeros(k, np.int64)
    moves = sweeps = 0
    gain_total = 0.0
    every = list(range(len(families)))
    for _ in range(max_sweeps):
        if deadline is not None and deadline.expired():
            break
        up_rows = [w * (np.abs(v + 1 - t) - np.abs(v - t)) for v, t, w in zip(values, targets, weights)]
        dn_rows = [w * (np.abs(v - 1 - t) - np.abs(v - t)) for v, t, w in zip(values, targets, weights)]
        cands = []  # (gain, plus cells (n, 0-2), minus cells (n, 0-2), moved axes or None: any family)
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
        if SWAP_CANDIDATES and not cands:  # swaps escape where the moves above find nothing
            _collect_swaps(cands, b, ones, up_cost, labels, up_rows, dn_rows, group, keep_total)
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
        touched = [np.zeros(v.size, bool) for v in values]
        applied = 0
        changed_by = {ax: [f for f, fam in enumerate(families) if all(x in fam for x in ax)]
                      for ax in set(axes) if ax is not None}
        for m in order:  # the improving moves of a sweep (at most MOVES_PER_KIND of each kind), not the cells
            n, r = which[m], local[m]
            up, down = plus[n][r], minus[n][r]
            if np.any(b[up] > 0.5) or np.any(b[down] < 0.5):
                continue  # an earlier move of this sweep took one of its cells
            if axes[n] is not None:
                # One-attribute moves and cycles put their cells in distinct rows of every family they change.
                net = np.concatenate([np.ones(up.size), -np.ones(down.size)])
                deltas = [(f, np.concatenate([labels[f][up], labels[f][down]]), net) for f in changed_by[axes[n]]]
            else:
                deltas = [(f,) + _net_change(labels[f], up, down) for f in every]
                deltas = [dl for dl in deltas if dl[1].size]
            if any(touched[f][rows].any() for f, rows, _ in deltas):
                continue  # its rows moved in this sweep: the next sweep prices it afresh
            # The gain again, from the current answers (earlier moves of this sweep may share rows).
            g = float(up_cost[up].sum() - up_cost[down].sum())
            for f, rows, net in deltas:
                v, t = values[f][rows], targets[f][rows]
                g += weights[f] * float((np.abs(v + net - t) - np.abs(v - t)).sum())
            if g >= -1e-9:
                continue
            b[up], b[down] = 1.0, 0.0
            for f, rows, net in deltas:
                values[f][rows] += net
                touched[f][rows] = True
            gain_total += g
            applied += 1
        moves += applied
        if applied == 0:
            break
    return b, {"sweeps": sweeps, "moves": moves, "gain": gain_total}


def _net_change(lab: np.ndarray, up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of one family a move changes and by how much (units into and out of one row cancel)."""
    rows = np.concatenate([lab[up], lab[down]])
    if rows.size == 2 and up.size == 1 and down.size == 1:
        if rows[0] == rows[1]:
            return rows[:0], np.zeros(0)
        return rows, np.array([1.0, -1.0])
    delta = np.concatenate([np.ones(up.size), -np.ones(down.size)])
    uniq, inv = np.unique(rows, return_inverse=True)
    net = np.bincount(inv, weights=delta, minlength=uniq.size)
    keep = net != 0
    return uniq[keep], net[keep]


def _collect_swaps(cands, b, ones, up_cost, labels, up_rows, dn_rows, group, keep_total: bool) -> None:
    """Append the best improving swaps (and, without a total to keep, single insertions and removals).

    A unit alone up at cell ``i`` gains ``gu_i = up_cost_i + Σ_f up_f[label_f(i)]``, alone down at
    ``j`` gains ``gd_j``; both together gain ``gu_i + gd_j`` less, on every family where ``i`` and
    ``j`` share a row, that row's ``up + down`` (the row does not change). The
    ``SWAP_CANDIDATES`` best of each side are paired and priced exactly.
    """
    zeros = np.flatnonzero(b < 0.5)
    if zeros.size == 0 or ones.size == 0 and keep_total:
        return
    gu = up_cost[zeros].copy()
    for lab, up in zip(labels, up_rows):
        gu += up[lab[zeros]]
    gd = -up_cost[ones]
    for lab, dn in zip(labels, dn_rows):
        gd += dn[lab[ones]]
    if not keep_total:
        for cells, g, is_up in ((zeros, gu, True), (ones, gd, False)):
            good = np.flatnonzero(g < -1e-9)
            if good.size > MOVES_PER_KIND:
                good = good[np.argpartition(g[good], MOVES_PER_KIND - 1)[:MOVES_PER_KIND]]
            if good.size:
                single, none = cells[good][:, None], np.zeros((good.size, 0), np.int64)
                cands.append((g[good], single, none, None) if is_up else (g[good], none, single, None))
    if ones.size == 0:
        return
    K = SWAP_CANDIDATES
    iu = np.argpartition(gu, min(K, gu.size) - 1)[:K] if gu.size > K else np.arange(gu.size)
    idn = np.argpartition(gd, min(K, gd.size) - 1)[:K] if gd.size > K else np.arange(gd.size)
    up_cells, dn_cells = zeros[iu], ones[idn]
    g = gu[iu][:, None] + gd[idn][None, :]
    for lab, up, dn in zip(labels, up_rows, dn_rows):
        li, lj = lab[up_cells], lab[dn_cells]
        same = li[:, None] == lj[None, :]
        g -= np.where(same, (up[li] + dn[li])[:, None], 0.0)
    g = np.where(group[up_cells][:, None] == group[dn_cells][None, :], g, np.inf)
    flat = np.flatnonzero(g.ravel() < -1e-9)
    if flat.size > MOVES_PER_KIND:
        flat = flat[np.argpartition(g.ravel()[flat], MOVES_PER_KIND - 1)[:MOVES_PER_KIND]]
    if flat.size:
        r, c = np.unravel_index(flat, g.shape)
        cands.append((g[r, c], up_cells[r][:, None], dn_cells[c][:, None], None))


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
