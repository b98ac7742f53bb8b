"""A feasible point by adding records: the repair of the certificate that stays near the data.

The certificate of :mod:`~dpopt.estimate.marginal_space.polytope.projection` needs a feasible
point (consistent, non-negative marginals). Its first repair mixes the candidate with an interior
point, a product table that spreads the total over every cell: on large sparse marginals a cell
at ``-10⁻³`` where the interior point holds ``0.05`` costs a mix of ``2·10⁻²`` of the way to a
table far from the data, and that cost, not the complementarity, was the certified gap on
adult's triples (issue 27; :func:`~dpopt.estimate.marginal_space.polytope.projection.gap_parts`).

**Records are consistent and non-negative.** A point mass at one record of the full domain adds 1
to exactly one cell of every marginal, the record's projection: any non-negative combination of
records is a consistent, non-negative family, whatever the cliques. So, with ``m = E x``,

    x' = (1 - s) x + Σ_j a_j δ_j,        a_j = -m_{c_j} > 0 for every negative cell c_j      (8)

is feasible: each negative cell ``c_j = (T, v_T)`` gets the record ``δ_j`` that agrees with it on
``T`` (so it is lifted to ``-s m_{c_j} >= 0``), and every other cell stays ``(1 - s) m >= 0`` plus
records. Cliques are taken fewest cells first, and a cell that earlier cliques' records have
already lifted gets only what it still lacks (:func:`lifting_records`). ``s = Σ a_j / N`` when
the total ``N`` is held (a fixed residual), 0 when it is free. The attributes outside ``T`` take
the modes of their one-way marginals, so that the other cells a record touches tend to be large
ones. The repair costs ``<κ, lift>`` to first order: the lifted mass times the multipliers at the
cells the records touch, first order in the violation cell by cell, where the mix costs the
largest ratio times ``<κ, m_int>`` over every cell. That cost was most of the certified gap (on
adult's 5-attribute slice, 7.5 of the absolute gap 8.1 after 50 ADMM steps), so given the
multipliers as a ``price`` the records move off the modes to cells where ``κ`` is smaller, one
attribute at a time (:func:`_cheaper_completions`): on the 84-triple stand-in's ADMM point at
step 1,000 the repair's cost fell from 327 to 175 (absolute gap 575 → 423). About half of what
is left is ``κ`` at the negative cells themselves, which falls only with the violation.

The records' residuals follow from their clique marginals ``v`` alone: for a consistent family
``adjoint(v)_A = D_A c_A`` with ``D = E^T E`` diagonal (layout notes), so ``c = adjoint(v) / D``:
one adjoint, no table. On the 9-attribute stand-in (84 triples of adult, 2.34 M cells) the same
ADMM points certified at a gap 30 to 55 times smaller than by the mix
(``examples/benchmarks/bench_admm.py``).

ADMM's certificate first lets each clique's own top residual absorb its negative cells
(:mod:`.local_repair`: no other clique moves), and lifts only what is left by records.

Not used (None) where a record would break a constraint: a fixed residual other than the total
(an exact marginal or invariant), or a record landing on a structural zero.

**Memory.** A record is priced by its cell in every clique, so a clique's records with their
cells take ``8 k |cliques|`` bytes for ``k`` records, several times over while they are priced.
Made all at once, the records of ADMM's checks were the run's transient peak: at memray's
high-water mark on the 84-triple stand-in (2.34 M clique cells) they held 0.89 GB against 1.24 GB
for everything else of the fit, and the peak resident size was 2,112 MB. They are now made in
batches of ``BATCH_CELLS // |cliques|`` records: each batch's records depend only on the clique's
shortfall, fixed before its first batch, so the records are the same and only the order of the
lift's sums changes. The records then held 0.33 GB at the high-water mark and the peak resident
size fell to 1,614 MB, with the same certified point (gap 8.33e-7 after 1,586 products;
``bench_admm_module.py --estimate`` under ``memray run``). On every triple of adult (20.9 M cells)
the peak resident size was 11.7 GB after 2,912 products, where the records made at once had taken
it to 14.9 GB by 2,009 (resident between checks 9-10 GB both times).
"""

from __future__ import annotations

import numpy as np

from dpopt.workers import in_threads, split_range, worker_threads

__all__ = ["BATCH_CELLS", "CANDIDATES", "lifting_records", "record_repair"]

#: Values tried for each attribute of a priced record (its most frequent ones).
CANDIDATES = 8
#: Records made at once times the cliques they touch (each record's flat cell in every clique is
#: held while its batch is priced): 2^22, 32 MB of cell indices per batch (module notes, *Memory*).
BATCH_CELLS = 2 ** 22
#: Records from which their priced completions run in pieces on several threads.
THREAD_RECORDS = 2 ** 12


def record_repair(problem, x: np.ndarray, m: np.ndarray, price: np.ndarray | None = None,
                  candidates: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray] | None:
    """``(x', E x')`` of equation (8) for residuals ``x`` with marginals ``m = E x``, or None.

    ``price`` (one number per clique cell, the multipliers ``κ``) steers the records' other
    attributes to cheap cells (:func:`lifting_records`). None when (8) does not apply: a fixed
    residual other than the total, a record on a structural zero, no non-negativity to restore, or
    a held total that the records would exhaust. When no cell is negative, ``(x, m)`` itself.
    """
    if not problem.nonnegative:
        return None
    fam, index = problem.cliques, problem.index
    total_at = index.position_of(())
    if np.any(np.flatnonzero(problem.fixed) != total_at):
        return None
    negative = m < 0
    zeros = problem.zero_cells
    if zeros is not None:
        negative &= ~zeros
    if not negative.any():
        return x, m
    _, mass, lift = lifting_records(problem, m, price, candidates)
    if zeros is not None and np.any(lift[zeros] != 0.0):
        return None
    shift = fam.adjoint(lift) / index.per_set(fam.diagonal())
    if problem.total_free:
        return x + shift, m + lift
    shrink = float(mass.sum()) / float(x[index.set_offsets[total_at]])
    if not 0.0 <= shrink < 1.0:
        return None
    return (1.0 - shrink) * x + shift, (1.0 - shrink) * m + lift


def lifting_records(problem, m: np.ndarray, price: np.ndarray | None = None,
                    candidates: int = CANDIDATES) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records of (8) for marginals ``m``: ``(records, mass, lift)``, ``records`` (k, d) value
    codes, ``mass`` (k,) their weights and ``lift`` the clique marginals of the weighted records.

    Clique by clique, fewest cells first, every cell of ``m + lift`` still negative (structural
    zeros aside) gets one record: the cell's values on the clique's attributes, the modes of ``m``
    elsewhere. A record lifts its cell in every clique, so a later clique needs records only for
    what the earlier ones left negative. With a ``price`` per clique cell (``κ >= 0``), records
    whose cells cost something are moved to cheaper ones, attribute by attribute among each
    attribute's ``candidates`` most frequent values (:func:`_cheaper_completions`).
    """
    fam, sizes, zeros = problem.cliques, problem.index.sizes, problem.zero_cells
    one_way = _one_way(fam, m, sizes)
    mode = np.zeros(len(sizes), dtype=np.int64)  # 0 for an attribute no clique holds: no cell depends on it
    for a, counts in one_way.items():
        mode[a] = int(np.argmax(counts))
    shapes = [tuple(int(sizes[a]) for a in axes) for axes in fam.sets]
    if price is not None:
        plan = _price_plan(fam, one_way, shapes, price, zeros, candidates)
    lift = np.zeros(fam.size)
    batch = max(int(BATCH_CELLS) // max(len(fam.sets), 1), 1)  # records per batch
    all_records, all_mass = [np.zeros((0, len(sizes)), dtype=np.int64)], [np.zeros(0)]
    for i in sorted(range(len(fam.sets)), key=lambda i: fam.cells[i]):  # a loop over sets, not cells
        part = slice(fam.offsets[i], fam.offsets[i] + fam.cells[i])
        low = m[part] + lift[part] < 0
        if zeros is not None:
            low &= ~zeros[part]
        local = np.flatnonzero(low)
        if local.size == 0:
            continue
        masses = -(m[part][local] + lift[part][local])  # what this clique lacks, before any of its records
        # its records in batches (module notes, *Memory*): a batch's records depend on no other's
        for start in range(0, local.size, batch):
            cells_here, mass = local[start:start + batch], masses[start:start + batch]
            records = np.tile(mode, (cells_here.size, 1))
            for a, value in zip(fam.sets[i], np.unravel_index(cells_here, shapes[i])):
                records[:, a] = value
            cells = [fam.offsets[j] + (np.ravel_multi_index(tuple(records[:, a] for a in axes), shapes[j]) if axes
                                       else np.zeros(cells_here.size, dtype=np.int64)) for j, axes in enumerate(fam.sets)]
            if price is not None:
                _cheaper_completions_in_pieces(records, cells, fam.sets[i], plan)
            for flat in cells:  # the records' cell in every clique
                np.add.at(lift, flat, mass)
            all_records.append(records)
            all_mass.append(mass)
    return np.concatenate(all_records), np.concatenate(all_mass), lift


def _price_plan(fam, one_way: dict, shapes, price, zeros, candidates) -> dict:
    """What :func:`_cheaper_completions` needs: the price (infinite on structural zeros, where no
    record may land), each attribute's candidate values (its ``candidates`` most frequent under
    its one-way marginal), the cliques holding it and its stride in each."""
    cost = np.array(price, dtype=np.float64)
    if zeros is not None:
        cost[zeros] = np.inf
    holding: dict[int, list[tuple[int, int]]] = {}
    for j, axes in enumerate(fam.sets):
        strides = np.cumprod((1,) + shapes[j][::-1])[:-1][::-1] if axes else ()
        for k, a in enumerate(axes):
            holding.setdefault(a, []).append((j, int(strides[k])))
    values = {a: np.argsort(-counts, kind="stable")[:max(int(candidates), 1)] for a, counts in one_way.items()}
    return {"price": cost, "holding": holding, "values": values}


def _cheaper_completions_in_pieces(records: np.ndarray, cells: list, fixed: tuple, plan: dict) -> None:
    """:func:`_cheaper_completions` on contiguous pieces of the records at once (each record's
    sweep is its own: the same records and cells as one call), from :data:`THREAD_RECORDS`
    records on. Its gathers from the price (random reads of a vector over every clique cell) were
    half of a check on all 364 triples of adult (102 of about 190 s, py-spy). On the 84-triple
    stand-in's records at ADMM's step 300 (2 cores) :func:`lifting_records` took 3.1-3.8 s on one
    thread and 2.5-3.1 s on two: the rest of it (the records' cells, the lift) is serial."""
    count = records.shape[0]
    threads = worker_threads() if count >= THREAD_RECORDS else 1
    pieces = split_range(count, threads)
    in_threads(lambda t: _cheaper_completions(records[pieces[t][0]:pieces[t][1]],
                                              [flat[pieces[t][0]:pieces[t][1]] for flat in cells], fixed, plan),
               len(pieces))


def _cheaper_completions(records: np.ndarray, cells: list, fixed: tuple, plan: dict) -> None:
    """One sweep of iterated conditional modes (Besag 1986) over the attributes outside ``fixed``:
    each record whose cells cost something takes, attribute by attribute, the candidate value
    that lowers the summed price of its cells in the cliques holding the attribute (ties keep the
    current value). ``records`` and ``cells`` (each record's flat cell per clique) change in place.

    The repair costs about ``Σ_j a_j Σ_C κ_C(record_j)`` (module notes), so a record at cells with
    ``κ = 0`` is free to first order: on adult's 84-triple stand-in (ADMM step 1,000) this
    halved the repair's cost, 327 to 175 of an absolute gap of 575, and on all 364 adult triples
    (step 500) cut it from 128,000 to 28,000.
    """
    price, holding, values = plan["price"], plan["holding"], plan["values"]
    total = np.zeros(records.shape[0])
    for flat in cells:
        total += price[flat]
    rows = np.flatnonzero(total > 0)  # a record on free cells cannot get cheaper
    if rows.size == 0:
        return
    for a in sorted(holding):
        if a in fixed:
            continue
        held = holding[a]
        current = records[rows, a]
        at = [cells[j][rows] for j, _ in held]
        best = np.zeros(rows.size)
        for flat in at:
            best += price[flat]
        choice = current.copy()
        for v in values[a]:
            shift = v - current
            cost = np.zeros(rows.size)
            for flat, (_, stride) in zip(at, held):
                cost += price[flat + shift * stride]
            better = cost < best
            best[better] = cost[better]
            choice[better] = v
        moved = choice != current
        if not moved.any():
            continue
        shift = (choice - current)[moved]
        for flat, (j, stride) in zip(at, held):
            cells[j][rows[moved]] = flat[moved] + shift * stride
        records[rows[moved], a] = choice[moved]


def _one_way(fam, m: np.ndarray, sizes: np.ndarray) -> dict:
    """Every held attribute's one-way marginal under ``m`` (read from the first clique holding it;
    the family is consistent, so any would do)."""
    one_way = {}
    for i, axes in enumerate(fam.sets):
        fresh = [j for j, a in enumerate(axes) if a not in one_way]
        if not fresh:
            continue
        table = fam.marginal(m, i).reshape(tuple(int(sizes[a]) for a in axes))
        for j in fresh:
            one_way[axes[j]] = table.sum(axis=tuple(k for k in range(len(axes)) if k != j))
    return one_way
