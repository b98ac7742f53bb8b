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

What changes is the representation (:mod:`dpopt.estimate.engines.factored`): the estimate is
``n`` times a product of small tables over groups of attributes, merged only when a
measured marginal spans several groups, so domains of ``2^1000`` cells are fine as long as
the groups stay small; a merge beyond ``max_group_cells`` is never done (never approximated).
Scoring is vectorised over all candidates: the model's cells come from its moments
(:class:`~dpopt.estimate.engines.factored.BinaryMarginalCells`, only the marginals touching a
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
holding ``S`` is at most the cap (:meth:`~dpopt.estimate.engines.factored.FactoredTable.within_cap`,
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

import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpopt.algorithms.base import Algorithm, AlgorithmParams, Release, register
from dpopt.algorithms.mwem import (
    SELECT_MODES,
    SelectedRows,
    check_round_options,
    measure_round,
    release_mwem_table,
    round_steps,
    run_budget,
    run_setup,
    split_round_budget,
)
from dpopt.algorithms.record_count import check_count_share, count_step, measure_count, rest_of_budget, scale_shares
from dpopt.errors import DataError, DomainError, DpoptError, ParameterError, QueryError, at_key
from dpopt.estimate.engines.factored import MAX_GROUP_CELLS, BinaryMarginalCells, FactoredMWState, FactoredTable
from dpopt.estimate.engines.proportional import counting_invariant
from dpopt.estimate.status import Status
from dpopt.model.binary_marginals import binary_marginal_counts, check_ways, require_binary
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import depends_on, restrict_query
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.marginal import Marginal, all_marginals
from dpopt.privacy.accountant import Accountant
from dpopt.privacy.mechanisms import exponential_mechanism
from dpopt.privacy.randomness import RandomSource

__all__ = ["FactoredMWEM", "FactoredMWEMParams", "factored_mwem", "default_rounds", "FactoredMWEMResult",
           "binary_marginal_counts",
           "require_binary"]

PASS_SCOPES = ("all", "group")
#: Domains up to this many cells get their table released (as the dense ``mwem`` does); larger ones
#: release the workload marginals and synthetic records only.
TABLE_CELLS = 10**6
LARGE_GROUP_POLICIES = ("exclude", "error")


class FactoredMWEMResult(Release):
    """The last iterate of :func:`factored_mwem`, kept factored, and the record of its rounds.

    A :class:`~dpopt.algorithms.base.Release` whose ``counts`` is None; its own fields:

    table : FactoredTable
        The last iterate ``A_T`` (``table.marginal(attrs)`` answers any marginal).
    selected : list of (marginal, cell)
        Each round's pick: the index of the marginal in ``all_marginals(domain, ways)``
        order and the cell (C order), or None for a whole marginal (``select="block"``).
    marginals : list of tuple of str
        The attributes of each selected marginal.
    rounds : int
    info : dict
        ``time_data`` (the data's answers, once) and the MWEM logic: ``time_score``,
        ``time_mask`` (the capped-group mask), ``time_select``, ``time_measure``,
        ``time_update``, their sum ``time_logic``: wall seconds; ``cpu_data``, ``cpu_score``,
        ..., ``cpu_logic``: the process's CPU seconds over the same spans (user + system, all
        threads: less inflated than wall time on a loaded machine); ``group_sizes`` (attributes per final
        group, largest first), ``largest_group_cells``, ``merges``, ``candidates``,
        ``excluded_candidates`` (per round, candidates left out by the group cap: cells with
        ``select="query"``, marginals with ``"block"``; zeros with ``on_large_group="error"``),
        ``excluded_candidates_total``, ``on_large_group``, ``passes``, per-round budgets.

    ``status`` is ``COMPLETED`` (no optimality claim); ``counts`` is None (the table stays factored).
    """


def factored_mwem(
    data: Dataset,
    ways: int,
    epsilon=None,
    *,
    rounds: int | None = None,
    rho=None,
    accountant: Accountant | None = None,
    rng: RandomSource | None = None,
    select: str = "block",
    repeat_passes: int = 5,
    pass_scope: str = "group",
    final_passes: int = 10,
    merge: bool = True,
    max_group_cells: int = MAX_GROUP_CELLS,
    on_large_group: str = "exclude",
    total: float | None = None,
    selection_share="1/2",
    constraints: ConstraintSet | None = None,
) -> FactoredMWEMResult:
    """MWEM (Hardt, Ligett, McSherry 2012, Fig. 1) on all ``ways``-way marginals, factored (Sec. 4).

    Parameters
    ----------
    data : Dataset
        The private records; every attribute must be binary (any number of attributes).
    ways : {1, 2, 3}
        The workload: every cell of every ``ways``-way marginal.
    epsilon, rho, accountant, rng, repeat_passes, total, selection_share
        As for the dense :func:`dpopt.algorithms.mwem.mwem` (the budget, where it is charged,
        the random source, the passes, the public ``n``, the selection's share).
    rounds : int, optional
        ``T``; default :func:`default_rounds` of the budget and the number of attributes.
    select : {"query", "block"}
        Single marginal cells (Fig. 1) or whole marginals ("cuboids", the default: see
        :func:`default_rounds` for the settings' rule).
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
    constraints : ConstraintSet, optional
        Public constraints: structural zeros (and hierarchies) are pinned at zero in the
        groups that hold their attributes; invariants on totals and marginals are imposed by
        proportional fitting of their groups after every round (a total invariant replaces
        ``n``). Other constraint kinds are refused.

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
    k = check_ways(ways, domain)
    require_binary(domain, "factored_mwem")
    _check_options(1 if rounds is None else rounds, select, repeat_passes, final_passes, merge, pass_scope,
                   on_large_group)
    if isinstance(max_group_cells, bool) or not isinstance(max_group_cells, (int, np.integer)) or max_group_cells < 2:
        raise ParameterError(f"max_group_cells must be an integer >= 2, got max_group_cells={max_group_cells!r}")
    accountant, kind, budget = run_budget(epsilon, rho, accountant, "factored_mwem")
    if rounds is None:
        rounds = default_rounds(kind, budget, len(domain))
    sel_share, rng, n = run_setup(data, selection_share, rng, total)

    phases = ("data", "score", "mask", "select", "measure", "update")
    timings = {f"{clock}_{phase}": 0.0 for clock in ("time", "cpu") for phase in phases}

    def lap(phase: str, since: tuple[float, float]) -> None:
        """Add the wall and CPU seconds since ``since`` to ``phase``."""
        timings[f"time_{phase}"] += time.perf_counter() - since[0]
        timings[f"cpu_{phase}"] += time.process_time() - since[1]

    tick = _clocks()
    true = data.binary_marginal_counts(k)  # the data's answers, once
    lap("data", tick)

    zeros, invariants, n = _factored_constraints(constraints, domain, n)
    tick = _clocks()
    table = FactoredTable(domain, n, max_group_cells=max_group_cells)
    for attrs, mask in zeros:
        table.pin_zeros(attrs, mask)
    for attrs, _, _ in invariants:
        table.merge(attrs)
    table.fit_invariants(invariants)
    state = FactoredMWState(table, merge=merge)
    model = BinaryMarginalCells(table, k)
    cells = 2**k
    errors = np.abs(n * model.cells - true)
    block_scores = errors.sum(axis=1) - cells if select == "block" else None
    lap("score", tick)
    tick = _clocks()
    within = table.within_cap(model.combos) if on_large_group == "exclude" else None
    lap("mask", tick)

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

        tick = _clocks()
        idx = model.refresh()
        if idx.size:
            errors[idx] = np.abs(n * model.cells[idx] - true[idx])
            if block_scores is not None:
                block_scores[idx] = errors[idx].sum(axis=1) - cells
        lap("score", tick)

        # Capped groups: which marginals may be measured, from the group structure alone.
        # A marginal's admission changes only when a group holding one of its attributes
        # changes, and a merge always creates a changed group: the marginals just
        # refreshed are the only ones to look at again.
        tick = _clocks()
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
        lap("mask", tick)

        tick = _clocks()
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
        lap("select", tick)

        tick = _clocks()
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
        lap("update", tick)

        tick = _clocks()
        marginal = Marginal(domain, attrs)
        query: LinearQuery = SelectedRows(marginal, rows) if row is not None else marginal
        m = measure_round(query, data, kind, meas_budget, accountant, rng, f"{label}: measure", true[b][rows])
        measurements.append(m)
        selected.append((int(b), row))
        chosen.append(attrs)
        lap("measure", tick)

        tick = _clocks()
        state.add_measurement(attrs, rows, m.values, key=attrs)
        if repeat_passes > 0:
            passes_done += state.passes(repeat_passes, group=attrs[0] if pass_scope == "group" else None)
        else:  # Fig. 1, step 3: the update of the new measurement alone
            state.update_once(attrs, rows, m.values)
        table.fit_invariants(invariants)
        lap("update", tick)
        remaining -= round_budget

    tick = _clocks()
    if final_passes > 0:
        passes_done += state.passes(final_passes)
        table.fit_invariants(invariants)
    lap("update", tick)
    sizes = sorted((len(g) for g in table.groups), reverse=True)
    info = dict(
        timings,
        time_logic=sum(timings[f"time_{phase}"] for phase in phases[1:]),
        cpu_logic=sum(timings[f"cpu_{phase}"] for phase in phases[1:]),
        passes=passes_done, updates=state.updates, round_budgets=budgets, total=n,
        total_public=total is None, select=select, kind=kind, ways=k, pass_scope=pass_scope,
        marginals=len(model.combos), candidates=len(model.combos) * per_marginal,
        on_large_group=on_large_group, excluded_candidates=excluded, excluded_candidates_total=int(sum(excluded)),
        merges=int(merges), group_sizes=sizes, groups=len(sizes),
        largest_group_cells=table.largest_group_cells,
        largest_group=max(table.groups, key=len),
    )
    return FactoredMWEMResult(table=table, measurements=measurements, selected=selected, marginals=chosen,
                              accountant=accountant, rounds=rounds, info=info, counts=None,
                              status=Status.COMPLETED, success=True, algorithm="mwem_factored",
                              reference=FactoredMWEM.reference, domain=domain,
                              message=f"factored MWEM ran its {rounds} rounds (no optimality claim)")


def _clocks() -> tuple[float, float]:
    """Wall and process CPU seconds now (the timings' two clocks)."""
    return time.perf_counter(), time.process_time()


def default_rounds(kind: str, amount, attributes: int) -> int:
    """``T`` when none is given: ``ceil(2 d eps^0.3)`` within ``[ceil(d/2), 4 d]``.

    ``d`` is the number of attributes and ``eps`` the budget (under zCDP the pure ``eps`` whose
    zCDP cost is the budget, ``sqrt(2 rho)``). MWEM's accuracy bound (Hardt, Ligett, McSherry
    2012, Theorem 2.2) trades ``n sqrt(log |D| / T)`` against ``T log |Q| / eps``: more budget
    buys more rounds, and ``log |D|`` grows with ``d``. The constants were fitted on a grid
    (block selection, 5 passes over the new measurement's group, 10 final passes; mean L1 error
    of every 3-way marginal, two seeds; ``docs/pages/algorithms/mwem.md`` has the table):
    nltcs (d = 16) is best at T = 32 for eps = 1 and T = 16 for eps = 0.1, a 27-attribute
    Bayesian network (n = 50,000) at T = 54 and T = 27. The rule gives 2d at eps = 1 and d at
    eps = 0.1, where the default of 10 rounds for every size stayed close to the uniform table.
    """
    eps = float(amount) if kind == "pure" else math.sqrt(2.0 * float(amount))
    d = max(int(attributes), 1)
    return int(min(max(math.ceil(2.0 * d * eps**0.3), math.ceil(d / 2)), 4 * d))


def _factored_constraints(constraints: ConstraintSet | None, domain: Domain, n: float):
    """``(zero patterns, invariants for proportional fitting, total)`` of public constraints.

    Zero patterns are ``(attrs, mask)``; invariants ``(attrs, query, values)`` for counting
    queries with disjoint 0/1 rows. An invariant covering every cell fixes the total ``n``
    (a total invariant does only that).
    """
    if constraints is None:
        return [], [], n
    if constraints.domain != domain:
        raise QueryError(f"constraints are over {constraints.domain}, not the data's {domain}")
    constraints.check()
    if constraints.inequalities:
        raise ParameterError("factored MWEM keeps structural zeros, hierarchies and invariants, not inequalities")
    zeros = [(attrs, mask) for _, attrs, mask in constraints.zero_patterns()]
    invariants = []
    for inv in constraints.invariants:
        attrs = depends_on(inv.query) or domain.attrs[:1]
        fit = counting_invariant(restrict_query(inv.query, attrs), inv.values, inv.name)
        if np.all(fit.coverage == 1):
            n = float(fit.values.sum())  # a covering invariant fixes the total
            if fit.query.num_rows == 1:
                continue  # a total: nothing left to fit
        invariants.append((domain.canonical(attrs), inv.query, fit.values))
    return zeros, invariants, n


# ---- the data's answers, once -------------------------------------------------------------------
# ---- validation ----------------------------------------------------------------------------------
def _check_options(rounds, select, repeat_passes, final_passes, merge, pass_scope, on_large_group) -> None:
    check_round_options(rounds, select, repeat_passes, final_passes)
    if pass_scope not in PASS_SCOPES:
        raise ParameterError(f"pass_scope must be one of {PASS_SCOPES}, got pass_scope={pass_scope!r}")
    if on_large_group not in LARGE_GROUP_POLICIES:
        raise ParameterError(
            f"on_large_group must be one of {LARGE_GROUP_POLICIES}, got on_large_group={on_large_group!r}"
        )
    if not isinstance(merge, bool):
        raise ParameterError(f"merge must be True or False, got merge={merge!r}")


# ---- the registered algorithm -------------------------------------------------------------------
@dataclass(frozen=True)
class FactoredMWEMParams(AlgorithmParams):
    """``[mwem_factored]``: the workload order and the options of :func:`factored_mwem`.

    Attributes
    ----------
    ways : {1, 2, 3}
        The workload: every cell of every ``ways``-way marginal of the binary domain.
    rounds, select, repeat_passes, pass_scope, final_passes, max_group_cells, on_large_group
        See :func:`factored_mwem`; ``rounds`` None: :func:`default_rounds` of the budget.
    table_cells : int
        Domains of at most this many cells get their table released; larger ones the workload
        marginals and synthetic records only (the full table is never formed).
    count_share : Fraction, optional
        None (default): the record count is public, as in the paper; a share in (0, 1): a noisy
        count paid first (:mod:`dpopt.algorithms.record_count`).
    """

    ways: int = 2
    rounds: int | None = None
    select: str = "block"
    repeat_passes: int = 5
    pass_scope: str = "group"
    final_passes: int = 10
    max_group_cells: int = MAX_GROUP_CELLS
    on_large_group: str = "exclude"
    table_cells: int = TABLE_CELLS
    count_share: Fraction | None = None

    def validate(self) -> None:
        object.__setattr__(self, "count_share", check_count_share(self.count_share))
        if isinstance(self.ways, bool) or self.ways not in (1, 2, 3):
            raise ParameterError(f"ways must be 1, 2 or 3, got {self.ways!r}")
        _check_options(1 if self.rounds is None else self.rounds, self.select, self.repeat_passes, self.final_passes,
                       True,
                       self.pass_scope, self.on_large_group)
        if isinstance(self.max_group_cells, bool) or not isinstance(self.max_group_cells, int) \
                or self.max_group_cells < 2:
            raise ParameterError(f"max_group_cells must be an integer >= 2, got {self.max_group_cells!r}")
        if isinstance(self.table_cells, bool) or not isinstance(self.table_cells, int) or self.table_cells < 0:
            raise ParameterError(f"table_cells must be an integer >= 0, got {self.table_cells!r}")

    @classmethod
    def from_spec(cls, reader) -> "FactoredMWEMParams":
        t = reader.table("mwem_factored", required=True)
        return cls(ways=t.int("ways", required=True, minimum=1), rounds=t.int("rounds", minimum=1),
                   select=t.str("select", default="block", choices=SELECT_MODES),
                   repeat_passes=t.int("repeat_passes", default=5, minimum=0),
                   pass_scope=t.str("pass_scope", default="group", choices=PASS_SCOPES),
                   final_passes=t.int("final_passes", default=10, minimum=0),
                   max_group_cells=t.int("max_group_cells", default=MAX_GROUP_CELLS, minimum=2),
                   on_large_group=t.str("on_large_group", default="exclude", choices=LARGE_GROUP_POLICIES),
                   table_cells=t.int("table_cells", default=TABLE_CELLS, minimum=0),
                   count_share=t.budget("count_share", unit=True))


@register
class FactoredMWEM(Algorithm):
    """MWEM on every ``ways``-way marginal of a binary domain, as a product of group tables (Section 4)."""

    name = "mwem_factored"
    title = "MWEM over all k-way marginals, the estimate kept as a product of small group tables"
    reference = "Hardt, Ligett, McSherry, NIPS 2012, Section 4 (factored MWEM)"
    accountings = ("pure", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants"})
    sections = {"mwem_factored": ("ways", "rounds", "select", "repeat_passes", "pass_scope", "final_passes",
                                  "max_group_cells", "on_large_group", "table_cells", "count_share")}
    #: The full table is never needed: released only when the domain has at most ``table_cells`` cells.
    dense_domain = False
    Params = FactoredMWEMParams

    def plan(self, domain, constraints, budget):
        try:
            require_binary(domain, "algorithm = 'mwem_factored'")
            k = check_ways(self.params.ways, domain)
        except DpoptError as exc:
            raise at_key(exc, ("mwem_factored", "ways")) from None
        workload = list(all_marginals(domain, k))
        rounds = self.rounds(budget, domain)
        share = self.params.count_share
        steps = scale_shares(round_steps(rounds, rest_of_budget(budget, share), workload, self.params.select,
                                         "factored mwem"), share)
        if share:
            steps.insert(0, count_step(domain, budget, share))
        rule = "" if self.params.rounds is not None else " (the default rule: ceil(2 d eps^0.3), within [d/2, 4d])"
        lines = [f"workload: every {k}-way marginal ({len(workload)} marginals, {len(workload) * 2**k:,} cells); "
                 f"{rounds} rounds{rule}, each split equally between selection and measurement",
                 f"the estimate is a product of group tables of at most {self.params.max_group_cells:,} cells",
                 f"the record count is measured with noise ({share} of the budget)" if share else
                 "the record count is treated as public (Hardt, Ligett, McSherry 2012)"]
        return self.new_plan(domain, constraints, budget, steps=steps, details=workload, lines=lines)

    def rounds(self, budget, domain) -> int:
        """``T``: the spec's, or :func:`default_rounds` of the budget and the attributes."""
        if self.params.rounds is not None:
            return self.params.rounds
        amount = budget.epsilon if budget.accounting == "pure" else budget.rho
        return default_rounds(budget.accounting, amount, len(domain))

    def run(self, plan, data, accountant, rng) -> Release:
        p = self.params
        count, n = measure_count(plan.steps[0], data, accountant, rng) if p.count_share else (None, None)
        res = factored_mwem(data, p.ways, accountant=accountant, rng=rng, rounds=self.rounds(plan.budget, plan.domain),
                            select=p.select,
                            repeat_passes=p.repeat_passes, pass_scope=p.pass_scope, final_passes=p.final_passes,
                            max_group_cells=p.max_group_cells, on_large_group=p.on_large_group,
                            constraints=plan.constraints, total=n)
        info = {"selected": [{"block": ", ".join(a), "row": r} for a, (_, r) in zip(res.marginals, res.selected)],
                "groups": res.info["groups"], "largest_group_cells": res.info["largest_group_cells"],
                "round_budgets": res.info["round_budgets"]}
        workload = [q.attrs for q in plan.details]
        if plan.domain.size <= p.table_cells:  # small enough: the table itself, as the dense mwem releases it
            return release_mwem_table(self, plan, accountant, res.table.to_dense(), res.table.total, res.measurements,
                                      res.rounds, info=info, marginals=workload, count=count)
        return self._release_factored(plan, accountant, rng, res, info, workload, count)

    def _release_factored(self, plan, accountant, rng, res, info, workload, count=None) -> Release:
        """No table: the workload marginals read off the factored estimate (built when read) and
        records drawn from it; with integrality, the records' marginals (whole, consistent)."""
        from dpopt.algorithms.base import make_release
        from dpopt.algorithms.marginal_space import marginal_release_answers
        from dpopt.estimate.marginal_space.sampling import product_records
        from dpopt.model.data import decode_codes

        table = res.table
        n = table.total
        integral = plan.constraints.integral
        if integral and abs(n - round(n)) > 1e-9:
            raise ParameterError(f"the public total {n!r} is not an integer")
        groups = [(table.group_axes(key), table.group_probabilities(key)) for key in table.revisions()]
        codes = product_records(plan.domain, groups, int(round(n)), rng=rng)
        answers = marginal_release_answers(plan.domain, workload, table.marginal, codes,
                                           res.measurements, integral)
        notes = [f"The record count n = {n:g} is treated as public, as in the paper; it is the released total and is "
                 "NOT protected by the privacy budget." if count is None else
                 f"The record count was measured with noise first (n = {n:g}, the noisy count: private).",
                 "Each round spends half its budget selecting a badly fit query (exponential mechanism) and half "
                 "measuring it; the ledger lists both.",
                 f"The domain has {plan.domain.size:.3g} cells, more than table_cells = {self.params.table_cells:,}: "
                 "no table is released. The marginals are read off the factored estimate (a product of "
                 f"{len(groups)} group tables); the synthetic records are drawn from it, each group's cells within "
                 "one record of n times their probability."]
        if integral:
            notes.append("Integer marginals: those of the synthetic records (whole persons, consistent); the "
                         "estimate's fractional counts are in the 'fitted' column.")
        release = make_release(self, plan, accountant, status=Status.COMPLETED,
                               message=f"{self.name} ran its {res.rounds} rounds (no optimality claim: the last "
                                       "iterate is released)",
                               records=decode_codes(codes, plan.domain), measurements=res.measurements,
                               notes=notes, info=info)
        release.answers = answers  # a lazy mapping: frames are built when read
        return release

    def memory(self, plan) -> list[tuple]:
        """What the run holds (read by ``resources``): the data's answers to every workload cell
        (with the model's and the scores beside them) and the group tables up to their cap."""
        k = self.params.ways
        cells = len(plan.details) * 2**k
        groups = min(self.params.max_group_cells, 2 ** len(plan.domain)) * 4
        return [("the factored MWEM workload", ("mwem_factored", "ways"), 8.0 * (4 * cells + 2 * groups),
                 f"{len(plan.details):,} {k}-way marginals ({cells:,} cells) and group tables of up to "
                 f"{self.params.max_group_cells:,} cells", "use a lower ways or fewer attributes")]

    @classmethod
    def example(cls, domain):
        if any(s != 2 for s in domain.sizes):
            return None
        return cls.Params(ways=min(2, len(domain)), rounds=4, select="block", repeat_passes=2)
