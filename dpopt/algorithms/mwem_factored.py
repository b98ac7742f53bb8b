"""MWEM on wide binary data: the factored form of Hardt, Ligett, McSherry (NIPS 2012), Section 4.

The privacy logic is exactly that of the dense :func:`dpopt.algorithms.mwem.mwem` (Fig. 1):
``T`` rounds, each spending ``eps/T`` (``rho/T`` under zCDP) split by ``selection_share``
between

1. **select**: the exponential mechanism over every cell of every ``k``-way marginal
   (``select="query"``) with score ``|q(A) - q(B)|`` (sensitivity 1), or over whole
   marginals (``"block"``) with score ``sum_cells |q(A) - q(B)| - #cells`` (sensitivity 1);
2. **measure**: exact discrete Laplace noise of scale ``2T/eps`` on the cell, or one Laplace
   vector on all the marginal's cells (discrete Gaussian under zCDP), charged first;
3. **update**: the MW step ``A(x) ∝ A(x) exp(q(x)(m - q(A))/(2n))`` (optionally repeated
   passes over all past measurements, as in the paper's Section 3).

What changes is the representation (:mod:`dpopt.estimate.factored`): the estimate is
``n`` times a product of small tables over groups of attributes, merged only when a
measured marginal spans several groups, so domains of ``2^1000`` cells are fine as long as
the groups stay small; a merge beyond ``max_group_cells`` is never done (never approximated).
Scoring is vectorised over all candidates: the model's cells come from its moments
(:class:`~dpopt.estimate.factored.BinaryMarginalCells`, only the marginals touching a
changed group are recomputed), and the data's cells are computed once from matrix
products of the 0/1 record matrix (:func:`binary_marginal_counts`).

Only the last iterate is released (the paper's experiments): the average of product tables
is not a product.

Capped groups
-------------
Section 4 keeps the estimate factored but leaves open what happens when measured marginals
link more attributes than a dense group table can hold. That happens in the paper's own
Section 4.1 set-up (100,000 records of independent bits with ``p = 0.1``, ``T`` = the number
of attributes): after the first few rounds every marginal is fitted to within the noise,
the selections are close to uniform, the selected marginals link attributes like a random
graph and one group would soon span most of them. With ``on_large_group="exclude"`` (the
default) each round's candidate set is therefore restricted, *before* the selection, to the
queries whose measurement keeps every group within ``max_group_cells``: a marginal on the
attributes ``S`` (all its cells with ``select="query"``, the marginal itself with
``"block"``) is a candidate iff the product of the cell counts of the distinct groups
holding ``S`` is at most the cap (:meth:`~dpopt.estimate.factored.FactoredTable.within_cap`,
one vectorised mask over all marginals).

*Privacy.* The group structure is a function of the marginals selected in earlier rounds
only, i.e. of earlier outputs of differentially private mechanisms, never of the data
itself; so the restricted candidate set is post-processing of released values, fixed
before the round's mechanisms look at the data. The exponential mechanism then runs over
that data-independent set with the same score, sensitivity 1 and budget, and the
measurement is unchanged; adaptive composition over the ``T`` rounds gives the same
``eps`` (``rho``) as the unrestricted run. The ledger is the same as without exclusion.

*Utility.* Excluded queries are never measured in that round; the accuracy bound of the
paper's Theorem 2.2 covers only the queries that remain candidates (their error still
enters the reported per-cell error). A marginal already inside one group is always a
candidate, so once anything has been measured the candidate set is never empty; only
round 1 can find every candidate excluded (``2^ways > max_group_cells``), and then the run
raises :class:`DomainError` before charging anything. ``on_large_group="error"`` keeps the
unrestricted candidate set and raises :class:`DomainError` at the first selection that
would need a larger merge (after charging that selection, before its measurement).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations

import numpy as np

from dpopt.algorithms.mwem import SelectedRows, measure_round, split_round_budget
from dpopt.errors import DataError, DomainError, PrivacyParameterError, QueryError, SolverError
from dpopt.estimate.factored import (
    MAX_GROUP_CELLS,
    BinaryMarginalCells,
    FactoredMWState,
    FactoredTable,
    attribute_combinations,
    cells_from_subset_moments,
)
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.marginal import Marginal
from dpopt.privacy.accountant import Accountant, as_fraction
from dpopt.privacy.mechanisms import exponential_mechanism
from dpopt.privacy.randomness import RandomSource, make_random

__all__ = ["factored_mwem", "FactoredMWEMResult", "binary_marginal_counts", "require_binary"]

SELECT_MODES = ("query", "block")
PASS_SCOPES = ("all", "group")
LARGE_GROUP_POLICIES = ("exclude", "error")
#: Bytes of one chunk of the 0/1 record matrix when the data's answers are computed.
CHUNK_BYTES = 2**26


@dataclass
class FactoredMWEMResult:
    """What a factored MWEM run releases and how it got there.

    Attributes
    ----------
    table : FactoredTable
        The last iterate ``A_T`` (``table.marginal(attrs)`` answers any marginal).
    measurements : list of Measurement
        Every noisy measurement, in order.
    selected : list of (marginal, cell)
        Each round's pick: the index of the marginal in ``all_marginals(domain, ways)``
        order and the cell (C order), or None for a whole marginal (``select="block"``).
    marginals : list of tuple of str
        The attributes of each selected marginal.
    accountant : Accountant
        Its ledger sums exactly to the budget.
    rounds : int
    info : dict
        ``time_data`` (the data's answers, once) and the MWEM logic: ``time_score``,
        ``time_mask`` (the capped-group mask), ``time_select``, ``time_measure``,
        ``time_update``, their sum ``time_logic``; ``group_sizes`` (attributes per final
        group, largest first), ``largest_group_cells``, ``merges``, ``candidates``,
        ``excluded_candidates`` (per round, candidates left out by the group cap: cells with
        ``select="query"``, marginals with ``"block"``; zeros with ``on_large_group="error"``),
        ``excluded_candidates_total``, ``on_large_group``, ``passes``, per-round budgets.
    """

    table: FactoredTable
    measurements: list[Measurement]
    selected: list[tuple[int, int | None]]
    marginals: list[tuple[str, ...]]
    accountant: Accountant
    rounds: int
    info: dict = field(default_factory=dict)


def factored_mwem(
    data: Dataset,
    ways: int,
    epsilon=None,
    *,
    rounds: int,
    rho=None,
    accountant: Accountant | None = None,
    rng: RandomSource | None = None,
    select: str = "query",
    repeat_passes: int = 0,
    pass_scope: str = "all",
    final_passes: int = 0,
    merge: bool = True,
    max_group_cells: int = MAX_GROUP_CELLS,
    on_large_group: str = "exclude",
    total: float | None = None,
    selection_share="1/2",
) -> FactoredMWEMResult:
    """MWEM (Hardt, Ligett, McSherry 2012, Fig. 1) on all ``ways``-way marginals, factored (Sec. 4).

    Parameters
    ----------
    data : Dataset
        The private records; every attribute must be binary (any number of attributes).
    ways : {1, 2, 3}
        The workload: every cell of every ``ways``-way marginal.
    epsilon : number
        Pure-DP budget of the run (exact rational; ``0.1`` means 1/10).
    rounds : int
        ``T``.
    rho : number
        zCDP budget instead of ``epsilon``.
    accountant : Accountant, optional
        Charged for every step; default a new one holding exactly the budget.
    rng : RandomSource, optional
        Default a fresh secure source.
    select : {"query", "block"}
        Single cells (Fig. 1) or whole marginals ("cuboids").
    repeat_passes : int
        Passes over past measurements after each round (0: the plain update of Fig. 1).
    pass_scope : {"all", "group"}
        ``"all"``: the passes go over every past measurement (the dense ``mwem``'s
        semantics); ``"group"``: only over the measurements held by the group of the new
        one (the only group whose information changed; far cheaper when T is large).
    final_passes : int
        Extra passes after the last round.
    merge : bool
        Apply all measurements of one marginal in one update (as the dense ``mwem``).
    max_group_cells : int
        Largest group table allowed (cells); never exceeded.
    on_large_group : {"exclude", "error"}
        What to do about queries whose measurement would merge groups beyond
        ``max_group_cells``. ``"exclude"`` (default, "capped groups"): before each round's
        selection they are removed from the candidate set, by a mask that depends only on
        the current group structure, itself a function of the earlier rounds' selections
        (post-processing of DP outputs, never of the data), so the exponential mechanism
        runs over a data-independent set with unchanged sensitivity and budget and the
        privacy guarantee is that of the unrestricted run (module docstring). Every round
        records how many candidates were left out (``info["excluded_candidates"]``); if
        every candidate is excluded (possible in round 1 only, when ``2^ways`` exceeds the
        cap) :class:`DomainError` is raised before that round charges anything.
        ``"error"``: all candidates stay; a selection that needs a larger merge raises
        :class:`DomainError` after its selection was charged and before its measurement.
        In both cases the error's ``round`` attribute is the failing round and the budget
        of the rounds so far stays charged.
    total : float, optional
        ``n``; default the data's record count, treated as public as in the paper.
    selection_share : number in (0, 1)
        Share of each round's budget for the selection (the paper: 1/2).

    Returns
    -------
    FactoredMWEMResult

    Notes
    -----
    With the same seed and options the run draws the same random numbers as the dense
    ``mwem(data, all_marginals(domain, ways), ...)`` and releases the same table (up to
    floating-point rounding), on domains small enough for the dense one, as long as the
    cap excludes nothing (then ``"exclude"`` and ``"error"`` runs are identical).
    """
    if not isinstance(data, Dataset):
        raise DataError(f"factored_mwem: data must be a Dataset, got {type(data).__name__}")
    domain = data.domain
    k = _check_ways(ways, domain)
    require_binary(domain, "factored_mwem")
    _check_options(rounds, select, repeat_passes, final_passes, merge, pass_scope, on_large_group)
    kind, budget = _budget(epsilon, rho)
    sel_share = as_fraction(selection_share, "selection_share")
    if not 0 < sel_share < 1:
        raise PrivacyParameterError(f"selection_share must be in (0, 1), got {selection_share!r}")
    if accountant is None:
        accountant = Accountant.pure(budget) if kind == "pure" else Accountant.zcdp(budget)
    rng = rng or make_random()
    n = float(data.total if total is None else total)
    if not n > 0:
        raise SolverError(f"total must be positive, got {n!r}")

    timings = dict.fromkeys(
        ("time_data", "time_score", "time_mask", "time_select", "time_measure", "time_update"), 0.0
    )
    tick = time.perf_counter()
    true = binary_marginal_counts(data, k)  # the data's answers, once
    timings["time_data"] = time.perf_counter() - tick

    tick = time.perf_counter()
    table = FactoredTable(domain, n, max_group_cells=max_group_cells)
    state = FactoredMWState(table, merge=merge)
    model = BinaryMarginalCells(table, k)
    cells = 2**k
    errors = np.abs(n * model.cells - true)
    block_scores = errors.sum(axis=1) - cells if select == "block" else None
    timings["time_score"] += time.perf_counter() - tick
    tick = time.perf_counter()
    within = table.within_cap(model.combos) if on_large_group == "exclude" else None
    timings["time_mask"] += time.perf_counter() - tick

    measurements: list[Measurement] = []
    selected: list[tuple[int, int | None]] = []
    chosen: list[tuple[str, ...]] = []
    budgets: list[str] = []
    remaining = budget
    per_round = budget / rounds
    merges = passes_done = 0
    excluded: list[int] = []
    per_marginal = cells if select == "query" else 1  # candidates per marginal
    for t in range(1, rounds + 1):
        round_budget = remaining if t == rounds else per_round
        budgets.append(str(round_budget))
        eps_sel, meas_budget = split_round_budget(kind, round_budget, sel_share)

        tick = time.perf_counter()
        idx = model.refresh()
        if idx.size:
            errors[idx] = np.abs(n * model.cells[idx] - true[idx])
            if block_scores is not None:
                block_scores[idx] = errors[idx].sum(axis=1) - cells
        timings["time_score"] += time.perf_counter() - tick

        # Capped groups: which marginals may be measured, from the group structure alone.
        # A marginal's admission changes only when a group holding one of its attributes
        # changes, and a merge always creates a changed group: the marginals just
        # refreshed are the only ones to look at again.
        tick = time.perf_counter()
        admitted = None  # None: every marginal (scores passed unchanged, as in the dense mwem)
        if within is not None:
            if idx.size:
                within[idx] = table.within_cap(model.combos[idx])
            if not within.all():
                admitted = np.flatnonzero(within)
                if admitted.size == 0:
                    error = DomainError(
                        f"factored_mwem round {t} of {rounds}: every one of the {len(model.combos)} {k}-way "
                        f"marginals would merge groups into more than max_group_cells={table.max_group_cells} "
                        f"cells (a {k}-way marginal alone has {cells}); nothing was charged for this round"
                    )
                    error.round = t  # type: ignore[attr-defined]
                    raise error
        excluded.append(0 if admitted is None else (len(model.combos) - admitted.size) * per_marginal)
        timings["time_mask"] += time.perf_counter() - tick

        tick = time.perf_counter()
        label = f"factored mwem round {t}"
        if select == "query":
            scores = errors if admitted is None else errors[admitted]
            flat = exponential_mechanism(scores.reshape(-1), eps_sel, accountant, rng, sensitivity=1.0,
                                         label=f"{label}: select")
            b, row = divmod(int(flat), cells)
            b = b if admitted is None else int(admitted[b])
            rows = np.array([row])
        else:
            scores = block_scores if admitted is None else block_scores[admitted]
            b = exponential_mechanism(scores, eps_sel, accountant, rng, sensitivity=1.0,
                                      label=f"{label}: select")
            b = b if admitted is None else int(admitted[b])
            row, rows = None, np.arange(cells)
        attrs = tuple(domain.attrs[i] for i in model.combos[b])
        timings["time_select"] += time.perf_counter() - tick

        tick = time.perf_counter()
        spanned = np.unique(table.owner[model.combos[b]]).size
        try:
            table.merge(attrs)  # the size guard raises here, before the measurement is paid
        except DomainError as exc:
            error = DomainError(
                f"factored_mwem round {t} of {rounds} (largest group so far {table.largest_group_cells} cells, "
                f"{len(table.groups)} groups): {exc}"
            )
            error.round = t  # type: ignore[attr-defined]  (for callers exploring feasible T)
            raise error from exc
        merges += spanned > 1
        timings["time_update"] += time.perf_counter() - tick

        tick = time.perf_counter()
        marginal = Marginal(domain, attrs)
        query: LinearQuery = SelectedRows(marginal, rows) if row is not None else marginal
        m = measure_round(query, data, kind, meas_budget, accountant, rng, f"{label}: measure", true[b][rows])
        measurements.append(m)
        selected.append((int(b), row))
        chosen.append(attrs)
        timings["time_measure"] += time.perf_counter() - tick

        tick = time.perf_counter()
        state.add_measurement(attrs, rows, m.values, key=attrs)
        if repeat_passes > 0:
            passes_done += state.passes(repeat_passes, group=attrs[0] if pass_scope == "group" else None)
        else:  # Fig. 1, step 3: the update of the new measurement alone
            state.update_once(attrs, rows, m.values)
        timings["time_update"] += time.perf_counter() - tick
        remaining -= round_budget

    tick = time.perf_counter()
    if final_passes > 0:
        passes_done += state.passes(final_passes)
    timings["time_update"] += time.perf_counter() - tick
    sizes = sorted((len(g) for g in table.groups), reverse=True)
    info = dict(
        timings,
        time_logic=sum(v for key, v in timings.items() if key != "time_data"),
        passes=passes_done, updates=state.updates, round_budgets=budgets, total=n,
        total_public=total is None, select=select, kind=kind, ways=k, pass_scope=pass_scope,
        marginals=len(model.combos), candidates=len(model.combos) * per_marginal,
        on_large_group=on_large_group, excluded_candidates=excluded, excluded_candidates_total=int(sum(excluded)),
        merges=int(merges), group_sizes=sizes, groups=len(sizes),
        largest_group_cells=table.largest_group_cells,
        largest_group=max(table.groups, key=len),
    )
    return FactoredMWEMResult(table, measurements, selected, chosen, accountant, rounds, info)


# ---- the data's answers, once -------------------------------------------------------------------
def binary_marginal_counts(data: Dataset, k: int, *, chunk_rows: int | None = None) -> np.ndarray:
    """Counts of every cell of every ``k``-way marginal of binary data, shape ``(M, 2^k)``.

    Rows follow :func:`~dpopt.estimate.factored.attribute_combinations` (the order of
    ``all_marginals``), cells C order. The subset counts ``sum_r w_r prod_{l in T} x_rl``
    come from matrix products of the 0/1 record matrix ``X`` (``1^T X``, ``X^T W X``, and
    for triples ``X_i^T W X_i`` over the records with ``x_i = 1``), taken in row chunks;
    inclusion-exclusion turns them into cells. Unweighted chunks use float32 BLAS, exact
    for counts below ``2^24`` per chunk; weighted data uses float64 (exact below ``2^53``).

    Parameters
    ----------
    data : Dataset
        Binary attributes only.
    k : {1, 2, 3}
    chunk_rows : int, optional
        Records per chunk (default: chunks of about 64 MB).
    """
    require_binary(data.domain, "binary_marginal_counts")
    k = _check_ways(k, data.domain)
    codes, weights = data.codes, data.weights
    rows_total, d = codes.shape
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_BYTES // (8 * d))
    chunk_rows = int(min(chunk_rows, 2**24 - 1))
    dtype = np.float32 if weights is None else np.float64
    first = np.zeros(d)
    second = np.zeros((d, d)) if k >= 2 else None
    third = [np.zeros((d - i - 1) * (d - i - 2) // 2) for i in range(d - 2)] if k == 3 else []
    upper = [np.triu_indices(d - i - 1, 1) for i in range(d - 2)] if k == 3 else []
    for start in range(0, rows_total, chunk_rows):
        x = codes[start:start + chunk_rows].astype(dtype)
        w = None if weights is None else weights[start:start + chunk_rows].astype(np.float64)
        xw = x if w is None else x * w[:, None]
        first += xw.sum(axis=0, dtype=np.float64)
        if second is not None:
            second += (xw.T @ x).astype(np.float64)
        on = np.ascontiguousarray(x.T) > 0 if k == 3 else None  # on[i]: the records with x_i = 1
        for i in range(d - 2 if k == 3 else 0):
            # Pair counts among the records with x_i = 1 are the triple counts (i, j, l), j, l > i.
            sub = x[on[i], i + 1:]
            subw = sub if w is None else sub * w[on[i]][:, None]
            third[i] += (subw.T @ sub).astype(np.float64)[upper[i]]
    combos = attribute_combinations(d, k)
    moments = np.empty((len(combos), 2**k))
    moments[:, 0] = float(data.total)
    for l in range(k):
        moments[:, 1 << (k - 1 - l)] = first[combos[:, l]]
    if k >= 2:
        for l, m in combinations(range(k), 2):
            moments[:, (1 << (k - 1 - l)) | (1 << (k - 1 - m))] = second[combos[:, l], combos[:, m]]
    if k == 3:
        moments[:, 7] = np.concatenate(third) if third else np.zeros(0)
    return cells_from_subset_moments(moments)


# ---- validation ----------------------------------------------------------------------------------
def require_binary(domain: Domain, who: str) -> None:
    """DomainError naming the first attribute without exactly two values."""
    for a, s in zip(domain.attrs, domain.sizes):
        if s != 2:
            raise DomainError(f"{who} needs binary attributes; attribute {a!r} has {s} values")


def _check_ways(ways, domain: Domain) -> int:
    if isinstance(ways, bool) or not isinstance(ways, (int, np.integer)) or ways not in (1, 2, 3):
        raise QueryError(f"ways must be 1, 2 or 3, got ways={ways!r}")
    if ways > len(domain):
        raise QueryError(f"ways={ways} exceeds the {len(domain)} attributes of the domain")
    return int(ways)


def _check_options(rounds, select, repeat_passes, final_passes, merge, pass_scope, on_large_group) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise SolverError(f"rounds must be a positive integer, got rounds={rounds!r}")
    if select not in SELECT_MODES:
        raise SolverError(f"select must be one of {SELECT_MODES}, got select={select!r}")
    for name, value in (("repeat_passes", repeat_passes), ("final_passes", final_passes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise SolverError(f"{name} must be a non-negative integer, got {name}={value!r}")
    if pass_scope not in PASS_SCOPES:
        raise SolverError(f"pass_scope must be one of {PASS_SCOPES}, got pass_scope={pass_scope!r}")
    if on_large_group not in LARGE_GROUP_POLICIES:
        raise SolverError(
            f"on_large_group must be one of {LARGE_GROUP_POLICIES}, got on_large_group={on_large_group!r}"
        )
    if not isinstance(merge, bool):
        raise SolverError(f"merge must be True or False, got merge={merge!r}")


def _budget(epsilon, rho) -> tuple[str, Fraction]:
    if (epsilon is None) == (rho is None):
        raise PrivacyParameterError("give exactly one of epsilon (pure DP) or rho (zCDP) to factored_mwem")
    name, value = ("epsilon", epsilon) if epsilon is not None else ("rho", rho)
    amount = as_fraction(value, name)
    if amount <= 0:
        raise PrivacyParameterError(f"{name} must be positive, got {name}={value!r}")
    return ("pure" if name == "epsilon" else "zcdp"), amount
