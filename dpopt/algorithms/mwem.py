"""MWEM: the multiplicative weights exponential mechanism (Hardt, Ligett, McSherry, NIPS 2012).

The algorithm of the paper's Figure 1, on any workload of linear queries. ``n`` records,
``A_0 = n * uniform``; for ``i = 1..T``:

1. **select** a badly fit query with the exponential mechanism at ``eps/(2T)`` and score
   ``s_i(q) = |q(A_{i-1}) - q(B)|`` (sensitivity 1): ``P(q) ∝ exp(eps s_i(q) / (4T))``;
2. **measure** it: ``m_i = q_i(B) + Lap(2T/eps)`` (budget ``eps/(2T)`` on a
   sensitivity-1 query gives the scale ``1/(eps/(2T)) = 2T/eps``; exact discrete noise);
3. **update** by multiplicative weights: ``A_i(x) ∝ A_{i-1}(x) exp(q_i(x)(m_i - q_i(A_{i-1}))/(2n))``.

Output the last iterate (the paper's experiments) or the average (its Theorem 2.2).
The whole run is eps-DP by sequential composition; the ledger sums exactly to eps.

The improvements of the paper's Section 3, each an option of :func:`mwem`:

* ``repeat_passes``: re-apply the update over all past measurements after each round
  (the reference code does 100 passes); ``boost`` lets the step grow while the squared
  residual falls (the entropy engine's schedule), reaching the same fixed point in far
  fewer passes;
* ``init_share``: spend a share of the budget on a noisy histogram (discrete Laplace on
  every cell) and start from its positive part;
* ``adaptive``: choose T on the fly by doubling the per-round budget (see :func:`mwem`);
* ``select="block"``: whole-marginal ("cuboid") selection: a block's score is
  ``sum_cells |q(A) - q(B)| - #cells`` (sensitivity: the block's L1 sensitivity, 1 for a
  marginal) and one Laplace vector measures all its cells.

A zCDP variant (``rho=``) selects with the exponential mechanism at ``eps_sel`` (charged
``eps_sel^2/2``, Bun & Steinke 2016, Prop. 1.4) and measures with the discrete Gaussian
mechanism, each round taking ``rho/T``.

Structural zeros are cells held at zero from the start, and invariants (totals, marginals)
hold after every update (:mod:`dpopt.estimate.engines.mw_step`). Candidate scores are computed for
all queries at once per round: one ``matvec`` per block, and for marginals of a binary
domain one Walsh-Hadamard transform of the estimate and 2^k coefficients per marginal.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure, Release
from dpopt.algorithms.base import check_marginals, make_release, marginal_answers, register, round_release
from dpopt.algorithms.record_count import (
    PUBLIC_N_NOTE,
    check_count_share,
    count_note,
    count_step,
    measure_count,
    rest_of_budget,
    scale_shares,
)
from dpopt.errors import DpoptError, ParameterError, PrivacyParameterError, QueryError, at_key
from dpopt.estimate.engines.mw_step import MWState, boxes
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import (Identity, Kronecker, LinearQuery, Marginal, RangeQueries, SelectedRows,
                                 WorkloadEvaluator, support_norm_powers)
from dpopt.privacy.accountant import Accountant, PrivacyCost, as_fraction
from dpopt.privacy.budget import Budget
from dpopt.privacy.mechanisms import calibrate, exponential_mechanism, measure
from dpopt.privacy.randomness import RandomSource, make_random

__all__ = ["MWEM", "MWEMParams", "mwem", "MWEMResult", "SelectedRows", "WorkloadEvaluator", "measure_round",
           "split_round_budget", "run_budget", "as_boxes"]

MWEM_REFERENCE = "Hardt, Ligett, McSherry, NIPS 2012, Fig. 1 and Section 3"

SELECT_MODES = ("query", "block")
ITERATES = ("last", "average")


# ---- result --------------------------------------------------------------------------------------
class MWEMResult(Release):
    """What an MWEM run releases and how it got there (a :class:`~dpopt.algorithms.base.Release`).

    Attributes (besides those of :class:`~dpopt.algorithms.base.Release`)
    -----------------------------------------------------------------------
    counts : ndarray
        The released table (``last`` or ``average``, per the ``iterate`` option); also ``x``.
    last, average : ndarray
        The last iterate ``A_T`` and the average of ``A_1..A_T``.
    selected : list of (block, row)
        The selected query each round (``row`` is None for a whole block).
    rounds : int
        ``T`` (chosen on the fly with ``adaptive``).
    info : dict
        Timings: wall seconds (``time_select``, ``time_measure``, ``time_update``,
        ``time_data``) and the process's CPU seconds over the same spans (``cpu_select``, ...;
        user + system, all threads: less inflated than wall time on a loaded machine), passes,
        per-round budgets.

    ``status`` is ``COMPLETED``: MWEM makes no optimality claim.
    """


# ---- the algorithm -------------------------------------------------------------------------------
def mwem(
    data: Dataset,
    workload: LinearQuery | Sequence[LinearQuery],
    epsilon=None,
    *,
    rounds: int = 10,
    rho=None,
    accountant: Accountant | None = None,
    rng: RandomSource | None = None,
    select: str = "query",
    repeat_passes: int = 0,
    boost: float = 1.0,
    final_passes: int = 0,
    tol: float = 0.0,
    merge: bool = True,
    init_share=0,
    adaptive: bool = False,
    iterate: str = "last",
    total: float | None = None,
    constraints: ConstraintSet | None = None,
    selection_share="1/2",
    progress: bool | None = None,
) -> MWEMResult:
    """Run MWEM (Hardt, Ligett, McSherry 2012, Fig. 1) with the options of its Section 3.

    Parameters
    ----------
    data : Dataset
        The private records; the domain must be small enough for a dense table (use
        :func:`dpopt.algorithms.mwem_factored.factored_mwem` for wide binary data).
    workload : LinearQuery or sequence of LinearQuery
        Query blocks (marginals, range batches, parities, predicate counts, ...). With
        ``select="query"`` every row of every block is a candidate; with ``"block"`` every
        block is.
    epsilon : number
        Pure-DP budget of the whole run (exact rational; ``0.1`` means 1/10).
    rounds : int
        ``T``. With ``adaptive`` it is the initial guess: the per-round budget starts at
        ``budget/T`` and doubles whenever a round's measured correction is within twice
        the noise's standard deviation (so the remaining budget buys fewer, more accurate
        rounds); the run ends when the budget is spent, the last round taking the exact
        remainder.
    rho : number
        zCDP budget instead of ``epsilon``.
    accountant : Accountant, optional
        Charged for every step; default a new one holding exactly the budget.
    rng : RandomSource, optional
        Default a fresh secure source.
    select : {"query", "block"}
        Single rows (Fig. 1) or whole blocks ("cuboids").
    repeat_passes : int
        Passes over all past measurements after each round (0: the plain update of Fig. 1).
    boost : float
        Largest multiple of the paper's step the repeated passes may reach (1: the paper's).
    final_passes : int
        Extra passes after the last round (converging the released estimate).
    tol : float
        Passes stop early when one moves less than ``tol * n`` in L1.
    merge : bool
        Apply all measurements of one block in one update (fast); False keeps the
        paper's one-update-per-measurement order.
    init_share : number in [0, 1)
        Share of the budget spent on a noisy histogram used as ``A_0``.
    iterate : {"last", "average"}
    total : float, optional
        ``n``; default the data's record count, treated as public as in the paper.
    constraints : ConstraintSet, optional
        Structural zeros (held at zero) and invariants (kept after every update).
    selection_share : number in (0, 1)
        Share of each round's budget for the selection (the paper: 1/2).
    progress : bool, optional
        A progress bar over the rounds (tqdm, on a terminal); default: when the workload has
        at least :data:`PROGRESS_CANDIDATES` candidate queries.

    Returns
    -------
    MWEMResult

    Notes
    -----
    Batches of ranges (:class:`~dpopt.model.queries.RangeQueries`) and Kronecker products of
    per-attribute interval queries (e.g. ``Kronecker([AllRanges, AllRanges])``: every box of a
    grid) are scored as boxes: every candidate's answer on the estimate is an
    inclusion-exclusion over ``2^d`` corners of the prefix sums of one marginal (a summed-area
    table), all boxes at once; the MW terms keep only the boxes measured.
    """
    domain = data.domain
    blocks = _check_workload(workload, domain)
    _check_options(rounds, select, iterate, repeat_passes, final_passes, boost, tol)
    accountant, kind, budget = run_budget(epsilon, rho, accountant, "mwem")
    init = as_fraction(init_share, "init_share")
    if not 0 <= init < 1:
        raise PrivacyParameterError(f"init_share must be in [0, 1), got {init_share!r}")
    sel_share, rng, n = run_setup(data, selection_share, rng, total)
    constraints = constraints if constraints is not None else ConstraintSet(domain)
    if constraints.domain != domain:
        raise QueryError(f"constraints are over {constraints.domain}, not the data's {domain}")
    constraints.check()
    zeros = constraints.zero_mask() if constraints.zero_rules else None
    invariants = [(inv.query, inv.values) for inv in constraints.invariants]

    timings = {f"{clock}_{phase}": 0.0 for clock in ("time", "cpu") for phase in ("data", "select", "measure",
                                                                                 "update")}

    def lap(phase: str, since: tuple[float, float]) -> tuple[float, float]:
        """Add the wall and CPU seconds since ``since`` to ``phase``; returns the clocks now."""
        now = (time.perf_counter(), time.process_time())
        timings[f"time_{phase}"] += now[0] - since[0]
        timings[f"cpu_{phase}"] += now[1] - since[1]
        return now

    tick = (time.perf_counter(), time.process_time())
    evaluator = WorkloadEvaluator(domain, blocks)
    true = evaluator.answers(data.histogram())  # the data's answers, once
    lap("data", tick)
    measurements: list[Measurement] = []

    initial = None
    if init > 0:
        hist_query = Identity(domain)
        m0 = measure_round(hist_query, data, kind, budget * init, accountant, rng, "mwem:noisy histogram",
                      data.histogram().astype(np.float64))
        measurements.append(m0)
        initial = np.asarray(m0.values)
    state = MWState(domain, n, zeros=zeros, invariants=invariants, initial=initial, merge=merge)

    score_sens = _score_sensitivity(blocks, select)
    remaining = budget * (1 - init)
    per_round = remaining / rounds
    selected: list[tuple[int, int | None]] = []
    budgets: list[str] = []
    average = np.zeros_like(state.x)
    passes_done = 0
    t = 0
    bar = _progress_bar(progress, evaluator.num_rows, rounds, adaptive)
    while remaining > 0:
        t += 1
        bar.update(1)
        last_round = (not adaptive and t == rounds) or (adaptive and remaining < 2 * per_round)
        round_budget = remaining if last_round else per_round
        budgets.append(str(round_budget))
        eps_sel, meas_budget = split_round_budget(kind, round_budget, sel_share)

        tick = (time.perf_counter(), time.process_time())
        estimate = evaluator.answers(state.x)
        errors = np.abs(estimate - true)
        if select == "query":
            flat = exponential_mechanism(errors, eps_sel, accountant, rng, sensitivity=score_sens,
                                         label=f"mwem round {t}: select")
            b, row = evaluator.locate(flat)
            rows = np.array([row])
            query: LinearQuery = _rows_of(blocks[b], rows)
        else:
            scores = np.add.reduceat(errors, evaluator.offsets[:-1]) - evaluator.sizes
            b = exponential_mechanism(scores, eps_sel, accountant, rng, sensitivity=score_sens,
                                      label=f"mwem round {t}: select")
            row, rows, query = None, np.arange(blocks[b].num_rows), blocks[b]
        tick = lap("select", tick)
        lo, hi = evaluator.offsets[b], evaluator.offsets[b + 1]
        answers = true[lo:hi][rows].astype(np.float64)
        m = measure_round(query, data, kind, meas_budget, accountant, rng, f"mwem round {t}: measure", answers)
        measurements.append(m)
        selected.append((b, row))
        tick = lap("measure", tick)
        before = estimate[lo:hi][rows]
        state.add_measurement(blocks[b], rows, m.values, key=b)
        if repeat_passes > 0:
            passes_done += state.passes(repeat_passes, tol, max_boost=boost)
        else:  # Fig. 1, step 3: the update of the new measurement alone
            state.update_once(blocks[b], rows, m.values)
        average += state.x
        lap("update", tick)

        remaining -= round_budget
        if adaptive and not last_round:
            correction = np.abs(np.asarray(m.values) - before).sum()
            if correction < 2.0 * m.stddev * rows.size:
                per_round = min(2 * per_round, remaining)
        if last_round:
            break

    bar.close()
    tick = (time.perf_counter(), time.process_time())
    if final_passes > 0:
        # Converges the released last iterate; the average stays over the rounds' iterates.
        passes_done += state.passes(final_passes, tol, max_boost=boost)
    lap("update", tick)
    average /= t
    last = state.x
    info = dict(timings, passes=passes_done, updates=state.updates, round_budgets=budgets,
                total=n, total_public=total is None, select=select, kind=kind)
    return MWEMResult(counts=last if iterate == "last" else average, last=last, average=average,
                      measurements=measurements, selected=selected, accountant=accountant, rounds=t, info=info,
                      status=Status.COMPLETED, success=True, algorithm="mwem", reference=MWEM_REFERENCE,
                      message=f"MWEM ran its {t} rounds (no optimality claim)", domain=domain)


# ---- helpers -------------------------------------------------------------------------------------
def measure_round(query, data, kind, budget, accountant, rng, label, answers) -> Measurement:
    """One round's measurement: discrete Laplace at ``epsilon = budget`` (pure) or discrete
    Gaussian at ``rho = budget`` (zCDP), charged to ``accountant`` before any noise is drawn."""
    cost = PrivacyCost.pure(budget) if kind == "pure" else PrivacyCost.zcdp(budget)
    return measure(query, data, calibrate(query, cost), accountant, rng, label=label, answers=answers)


def split_round_budget(kind: str, round_budget: Fraction, share: Fraction) -> tuple[Fraction, Fraction]:
    """(selection epsilon, measurement budget) of one round, summing exactly to the round's budget.

    Pure: ``share * eps_r`` and the rest. zCDP: the exponential mechanism at ``eps_sel`` costs
    ``eps_sel^2 / 2``; ``eps_sel`` is a rational just below ``sqrt(2 share rho_r)`` and the
    Gaussian measurement takes exactly the remainder.
    """
    if kind == "pure":
        eps_sel = round_budget * share
        return eps_sel, round_budget - eps_sel
    target = math.sqrt(2 * float(round_budget * share))
    eps_sel = Fraction(target).limit_denominator(10**9)
    while eps_sel * eps_sel / 2 >= round_budget:
        eps_sel *= Fraction(999, 1000)
    return eps_sel, round_budget - eps_sel * eps_sel / 2


def run_budget(epsilon, rho, accountant: Accountant | None, who: str) -> tuple[Accountant, str, Fraction]:
    """``(accountant, kind, amount)`` of a run: ``epsilon`` (pure) or ``rho`` (zCDP) to spend, or
    everything that remains of ``accountant`` when neither is given."""
    if epsilon is None and rho is None:
        if accountant is None:
            raise PrivacyParameterError(f"give exactly one of epsilon (pure DP) or rho (zCDP) to {who}, "
                                        "or an accountant to spend")
        if accountant.kind not in ("pure", "zcdp"):
            raise PrivacyParameterError(f"{who} runs under pure DP or zCDP, not {accountant.kind!r} accounting")
        left = accountant.remaining
        return accountant, accountant.kind, left.epsilon if accountant.kind == "pure" else left.rho
    if epsilon is not None and rho is not None:
        raise PrivacyParameterError(f"give exactly one of epsilon (pure DP) or rho (zCDP) to {who}")
    name, value = ("epsilon", epsilon) if epsilon is not None else ("rho", rho)
    amount = as_fraction(value, name)
    if amount <= 0:
        raise PrivacyParameterError(f"{name} must be positive, got {name}={value!r}")
    budget = Budget.pure(amount) if name == "epsilon" else Budget.zcdp(amount)
    return accountant if accountant is not None else budget.accountant(), budget.accounting, amount


def run_setup(data: Dataset, selection_share, rng: RandomSource | None, total) -> tuple[Fraction, RandomSource, float]:
    """The selection's share of each round, the random source and the public ``n`` of a run."""
    sel_share = as_fraction(selection_share, "selection_share")
    if not 0 < sel_share < 1:
        raise PrivacyParameterError(f"selection_share must be in (0, 1), got {selection_share!r}")
    n = float(data.total if total is None else total)
    if not n > 0:
        raise ParameterError(f"total must be positive, got {n!r}")
    return sel_share, rng or make_random(), n


def _check_workload(workload, domain: Domain) -> list[LinearQuery]:
    blocks = [workload] if isinstance(workload, LinearQuery) else list(workload)
    if not blocks:
        raise QueryError("mwem: the workload is empty")
    for i, b in enumerate(blocks):
        if not isinstance(b, LinearQuery):
            raise QueryError(f"mwem: workload item {i} is a {type(b).__name__}, not a LinearQuery")
        if b.domain != domain:
            raise QueryError(f"mwem: workload item {i} ({b.name}) is over {b.domain}, not the data's {domain}")
    domain.require_dense("the MWEM estimate")
    return [as_boxes(b) or b for b in blocks]


def as_boxes(query: LinearQuery) -> RangeQueries | None:
    """A Kronecker product of per-attribute interval queries as the batch of boxes it is (same
    rows, same order), or None when it is not one.

    Each factor must act on one attribute and each of its rows be a run of ones over
    consecutive values (``AllRanges``, ``Prefix``, ``Identity``, a total): a product row is then
    the box of its factors' intervals.
    """
    if not isinstance(query, Kronecker) or any(len(f.attrs) != 1 for f in query.factors):
        return None
    lows, highs = [], []
    for f in query.factors:
        interval = _intervals(f.matrix)
        if interval is None:
            return None
        lows.append(interval[0])
        highs.append(interval[1])
    grid = np.indices([lo.size for lo in lows]).reshape(len(lows), -1)  # C order over factor rows
    lo = np.stack([low[g] for low, g in zip(lows, grid)], axis=1)
    hi = np.stack([high[g] for high, g in zip(highs, grid)], axis=1)
    return RangeQueries(query.domain, [f.attrs[0] for f in query.factors], lo, hi)


def _intervals(matrix: sp.spmatrix) -> tuple[np.ndarray, np.ndarray] | None:
    """``(low, high)`` of every row of a 0/1 matrix whose rows are runs of ones, else None."""
    m = sp.csr_matrix(matrix, copy=True)
    m.eliminate_zeros()
    m.sort_indices()
    count = np.diff(m.indptr)
    if (count == 0).any() or not np.all(m.data == 1.0):
        return None
    low = m.indices[m.indptr[:-1]]
    offset = np.arange(m.nnz) - np.repeat(m.indptr[:-1], count)
    if not np.array_equal(m.indices, np.repeat(low, count) + offset):
        return None
    return low.astype(np.int64), (low + count - 1).astype(np.int64)


def _rows_of(block: LinearQuery, rows: np.ndarray) -> LinearQuery:
    """The selected rows of a block as the query that is measured (boxes stay boxes)."""
    return boxes(block, rows) if isinstance(block, RangeQueries) else SelectedRows(block, rows)


#: A workload with at least this many candidate queries shows a progress bar by default.
PROGRESS_CANDIDATES = 10**6


def _progress_bar(progress: bool | None, candidates: int, rounds: int, adaptive: bool):
    from tqdm import tqdm

    show = progress if progress is not None else candidates >= PROGRESS_CANDIDATES
    return tqdm(total=None if adaptive else rounds, desc=f"mwem over {candidates:,} queries", unit="round",
                disable=False if progress else (None if show else True), leave=False)


def check_round_options(rounds, select, repeat_passes, final_passes) -> None:
    """The options every MWEM form shares: ``T``, the selection mode and the passes."""
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ParameterError(f"rounds must be a positive integer, got rounds={rounds!r}")
    if select not in SELECT_MODES:
        raise ParameterError(f"select must be one of {SELECT_MODES}, got select={select!r}")
    for name, value in (("repeat_passes", repeat_passes), ("final_passes", final_passes)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ParameterError(f"{name} must be a non-negative integer, got {name}={value!r}")


def _check_options(rounds, select, iterate, repeat_passes, final_passes, boost, tol) -> None:
    check_round_options(rounds, select, repeat_passes, final_passes)
    if iterate not in ITERATES:
        raise ParameterError(f"iterate must be one of {ITERATES}, got iterate={iterate!r}")
    if not (isinstance(boost, (int, float)) and boost >= 1):
        raise ParameterError(f"boost must be a number >= 1, got boost={boost!r}")
    if not (isinstance(tol, (int, float)) and tol >= 0):
        raise ParameterError(f"tol must be a number >= 0, got tol={tol!r}")


def _score_sensitivity(blocks: Sequence[LinearQuery], select: str) -> float:
    """Sensitivity of the selection score.

    A single row's ``|q(A) - q(B)|`` moves by at most the largest entry ``|Q_ij|`` (1 for
    counting queries and parities); a block's ``sum |error| - #rows`` by at most the
    block's L1 sensitivity (1 for a marginal).
    """
    if select == "block":
        return max(b.sensitivity(1) for b in blocks)
    worst = 0.0
    for b in blocks:
        if isinstance(b, RangeQueries):  # 0/1 entries
            worst = max(worst, 1.0)
            continue
        # Integer entries with |q| = q^2 in every column lie in {-1, 0, 1}.
        l1, l2 = support_norm_powers(b, 1.0), support_norm_powers(b, 2.0)
        if b.is_integer and l1[0] == l2[0] and np.array_equal(l1[1], l2[1]):
            worst = max(worst, 1.0)
        else:
            worst = max(worst, float(abs(sp.csr_matrix(b.restrict().to_sparse())).max()))
    return worst


# ---- the registered algorithm -------------------------------------------------------------------
@dataclass(frozen=True)
class MWEMParams(AlgorithmParams):
    """``[mwem]``: the workload (marginals, or ranges and products of per-attribute workloads) and
    the paper's options.

    Attributes
    ----------
    marginals : int or tuple of tuple of str
        Every ``k``-way marginal, or the list of marginals (the workload ``Q``).
    workload : WorkloadSpec or LinearQuery or None
        A workload other than marginals, replacing ``marginals`` when given: one of
        :data:`WORKLOAD_KINDS` (ranges over one attribute or every box over several, random boxes,
        products of per-attribute workloads such as ``all_ranges`` x ``all_ranges``; see
        :class:`~dpopt.spec.queries.WorkloadSpec`), or a query over the plan's domain. Each
        product (or the query) is a block of candidate queries.
    rounds : int
        ``T``.
    select : {"query", "block"}
        Single marginal cells (Fig. 1) or whole marginals ("cuboids", Section 3); a ``workload``
        is selected query by query.
    repeat_passes : int
        Passes of the update over all past measurements after each round (Section 3).
    count_share : Fraction, optional
        None (default): the record count is public, as in the paper. A share in (0, 1): the
        count is measured with that share of the budget first and used as ``n``
        (:mod:`dpopt.algorithms.record_count`), so the release is private for added or
        removed records.
    transcript : bool
        Also release the measurement transcript (:mod:`dpopt.algorithms.transcript`): every
        noisy answer drawn, exactly as used, with the query each round selected. No privacy
        cost (they are the mechanisms' outputs; the table is post-processing of them) and no
        other output changes; it lets an audit see the answers' low-order bits, which the
        rounded table hides. Default False.
    """

    marginals: int | tuple[tuple[str, ...], ...] = 2
    rounds: int = 10
    select: str = "query"
    repeat_passes: int = 0
    workload: "WorkloadSpec | LinearQuery | None" = None
    count_share: Fraction | None = None
    transcript: bool = False

    def validate(self) -> None:
        from dpopt.spec.queries import WorkloadSpec

        check_marginals(self.marginals, "marginals")
        _check_options(self.rounds, self.select, "last", self.repeat_passes, 0, 1.0, 0.0)
        object.__setattr__(self, "count_share", check_count_share(self.count_share))
        if not isinstance(self.transcript, bool):
            raise ParameterError(f"transcript must be true or false, got {self.transcript!r}")
        if self.workload is not None:
            if not isinstance(self.workload, (WorkloadSpec, LinearQuery)):
                raise ParameterError(f"workload must be a WorkloadSpec or a LinearQuery, got "
                                     f"{type(self.workload).__name__}")
            if isinstance(self.workload, WorkloadSpec) and self.workload.kind not in WORKLOAD_KINDS:
                raise ParameterError(f"workload: MWEM takes the kinds {list(WORKLOAD_KINDS)} (marginals go in "
                                     f"marginals), got {self.workload.kind!r}")
            if self.select == "block":
                raise ParameterError("select = \"block\" applies to marginals: a block of ranges would be "
                                     "measured with the noise of its most covered cell; use select = \"query\"")

    def to_dict(self) -> dict:
        out = super().to_dict()
        w = self.workload
        if w is None:
            out.pop("workload", None)
        else:
            out.pop("marginals", None)
            out["workload"] = w.name if isinstance(w, LinearQuery) else w.describe()
        return out

    @classmethod
    def from_spec(cls, reader) -> "MWEMParams":
        from dpopt.spec.queries import parse_marginals, parse_workload

        t = reader.table("mwem", required=True)
        if t.has("workload") and t.has("marginals"):
            raise t.error(("workload",), "give the marginals (marginals) or another workload (workload), not both")
        workload = parse_workload(t, WORKLOAD_KINDS) if t.has("workload") else None
        select = t.str("select", default="query", choices=SELECT_MODES)
        if workload is not None and select == "block":
            raise t.error(("select",), "\"block\" applies to marginals: a block of ranges would be measured with "
                          "the noise of its most covered cell; use \"query\"")
        return cls(parse_marginals(t) if workload is None else 2, rounds=t.int("rounds", default=10, minimum=1),
                   select=select, repeat_passes=t.int("repeat_passes", default=0, minimum=0), workload=workload,
                   count_share=t.budget("count_share", unit=True), transcript=t.bool("transcript", default=False))


#: Workload kinds ``[mwem] workload`` takes (marginals are given by ``marginals``).
WORKLOAD_KINDS = ("all_ranges", "prefix", "random_ranges", "product")


@register
class MWEM(Algorithm):
    """MWEM over a workload of marginals, ranges or products of per-attribute workloads (module
    notes), released as a table."""

    name = "mwem"
    title = "multiplicative weights with the exponential mechanism over a workload of counting queries"
    reference = MWEM_REFERENCE
    accountings = ("pure", "zcdp")
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants"})
    sections = {"mwem": ("marginals", "rounds", "select", "repeat_passes", "workload", "attrs", "k", "count",
                         "workload_seed", "product", "count_share", "transcript")}
    Params = MWEMParams

    def plan(self, domain, constraints, budget):
        p = self.params
        key = ("mwem", "marginals" if p.workload is None else "workload")
        try:
            workload = marginal_workload(domain, p.marginals) if p.workload is None else _workload_blocks(
                p.workload, domain)
        except (DpoptError, ValueError) as exc:
            raise at_key(QueryError(str(exc)), key) from None
        share = p.count_share
        steps = scale_shares(round_steps(p.rounds, rest_of_budget(budget, share), workload, p.select, "mwem"), share)
        if share:
            steps.insert(0, count_step(domain, budget, share))
        queries = sum(q.num_rows for q in workload)
        what = f"{len(workload)} marginals" if p.workload is None else (
            p.workload.name if isinstance(p.workload, LinearQuery) else p.workload.describe())
        lines = [f"workload: {what}, {queries:,} queries; "
                 f"{p.rounds} rounds, each split equally between selection and measurement",
                 f"the record count is measured with noise ({share} of the budget)" if share else
                 "the record count is treated as public (Hardt, Ligett, McSherry 2012)"]
        return self.new_plan(domain, constraints, budget, steps=steps, details=workload, lines=lines)

    def run(self, plan, data, accountant, rng) -> Release:
        from dpopt.model.queries import depends_on

        p, workload = self.params, plan.details
        count, n = measure_count(plan.steps[0], data, accountant, rng) if p.count_share else (None, None)
        res = mwem(data, workload, accountant=accountant, rng=rng, rounds=p.rounds, select=p.select,
                   repeat_passes=p.repeat_passes, constraints=plan.constraints, total=n)
        tables = list(dict.fromkeys(depends_on(q) for q in workload if depends_on(q)))
        return release_mwem_table(self, plan, accountant, res.x, float(res.info["total"]), res.measurements,
                                  res.rounds, info={"selected": [{"block": _block_name(workload[b]), "row": r}
                                                                 for b, r in res.selected],
                                                    "round_budgets": list(res.info.get("round_budgets", []))},
                                  marginals=tables, count=count,
                                  transcript=_selections(workload, res.selected) if p.transcript else None)

    @classmethod
    def example(cls, domain):
        return cls.Params(marginals=min(2, len(domain)), rounds=4, select="block", repeat_passes=2)


def _workload_blocks(workload, domain: Domain) -> list[LinearQuery]:
    """The blocks of candidate queries of a ``workload``: a query (over the plan's domain) or each
    product of a :class:`~dpopt.spec.queries.WorkloadSpec`."""
    if isinstance(workload, LinearQuery):
        if workload.domain != domain:
            raise QueryError(f"the workload is over {workload.domain}, not the plan's {domain}")
        return [workload]
    return workload.blocks(domain)


def _selections(workload, selected) -> list[tuple[int, np.ndarray, str]]:
    """Each round's ``(block, rows, name)`` for the transcript: the selected row, or every row of
    the selected block (``select = "block"``)."""
    return [(b, np.arange(workload[b].num_rows) if row is None else np.array([row]), _block_name(workload[b]))
            for b, row in selected]


def _block_name(query: LinearQuery) -> str:
    return ", ".join(query.attrs) if isinstance(query, Marginal) else query.name


def marginal_workload(domain: Domain, marginals) -> list[Marginal]:
    """The marginals of a workload given as an order ``k`` or a list of attribute lists."""
    from dpopt.model.queries.marginal import all_marginals

    marginals = check_marginals(marginals)
    if isinstance(marginals, int):
        if marginals > len(domain):
            raise QueryError(f"order {marginals} exceeds the {len(domain)} attributes of the domain")
        return list(all_marginals(domain, marginals))
    return [Marginal(domain, attrs) for attrs in marginals]


def round_steps(rounds: int, budget: Budget, workload, select: str, label: str,
                selection_share: Fraction = Fraction(1, 2)) -> list[PlannedMeasure]:
    """The plan of ``rounds`` MWEM rounds: each round's selection and measurement, with its noise.

    Every marginal has L1 sensitivity 1 and squared L2 sensitivity 1 (whole marginal) or one
    cell's, so one calibration per round gives the law of whichever query is selected.
    """
    kind = budget.accounting
    amount = budget.epsilon if kind == "pure" else budget.rho
    per_round = amount / rounds
    eps_sel, meas = split_round_budget(kind, per_round, selection_share)
    sel_cost = PrivacyCost.pure(eps_sel)
    meas_cost = PrivacyCost.pure(meas) if kind == "pure" else PrivacyCost.zcdp(meas)
    query = workload[0] if select == "block" else SelectedRows(workload[0], [0])
    law = calibrate(query, meas_cost)
    sel_amount = eps_sel if kind == "pure" else eps_sel * eps_sel / 2
    steps = []
    for t in range(1, rounds + 1):
        steps.append(PlannedMeasure(f"{label} round {t}: select", None, "exponential", sel_amount / amount,
                                    sel_cost if kind == "pure" else PrivacyCost.zcdp(sel_amount),
                                    what="exponential mechanism over the workload"))
        steps.append(PlannedMeasure(f"{label} round {t}: measure", None, law.mechanism, meas / amount, meas_cost,
                                    law, what="the selected " + ("marginal" if select == "block" else "cell"),
                                    answers=query.num_rows))
    return steps


def release_mwem_table(algorithm, plan, accountant, x, n, measurements, rounds, *, info, marginals,
                       count=None, transcript=None) -> Release:
    """An MWEM table as a release: rounded to integers keeping the total ``n`` when integral (the
    public n, or the noisy ``count`` measured first: :mod:`dpopt.algorithms.record_count`).

    ``transcript``: None, or each of ``measurements``' ``(block, rows, name)``; the release then
    holds ``transcript``, the table of :func:`~dpopt.algorithms.transcript.transcript_frame`
    (the noisy count first, outside the workload)."""
    from dpopt.model.constraints import ConstraintSet, Invariant, NonNegativity
    from dpopt.model.queries.basic import Total

    constraints = plan.constraints
    share = getattr(algorithm.params, "count_share", None)
    if count is not None:
        measurements = [count, *measurements]
    public = PUBLIC_N_NOTE.format(n=n, where="the released total")
    notes = [count_note(round(n), share) if count is not None else public,
             "Each round spends half its budget selecting a badly fit query (exponential mechanism) and half "
             "measuring it; the ledger lists both.",
             "The released marginals are read from the released table and have no 'noisy' column; the report "
             "lists each measurement's query and noise, and the option transcript = true releases the noisy answers "
             "themselves (the measurement transcript, at no privacy cost)."]
    if constraints.integral:
        if abs(n - round(n)) > 1e-9:
            raise ParameterError(f"the public total {n!r} is not an integer")
        constraints = ConstraintSet(constraints.domain, list(constraints.constraints))
        if not constraints.nonnegative:
            constraints.add(NonNegativity())
        total = "total (noisy count)" if count is not None else "total (public in MWEM)"
        constraints.add(Invariant(Total(constraints.domain), np.array([round(n)], dtype=float), name=total))
        notes.append("The last iterate was rounded to the L1-closest non-negative integer table with the same total.")
    counts, rounding, failure = round_release(np.asarray(x, dtype=np.float64), constraints, method="cellwise")
    if failure is not None:
        release = make_release(algorithm, plan, accountant, status=rounding.status, message=failure,
                               measurements=measurements, rounding=rounding, notes=notes,
                               info={**info, "spec_key": ("constraints", "integer")})
    else:
        release = make_release(algorithm, plan, accountant, status=Status.COMPLETED,
                               message=f"{algorithm.name} ran its {rounds} rounds (no optimality claim: the last "
                                       "iterate is released)",
                               counts=counts, answers=marginal_answers(plan.domain, counts, marginals),
                               measurements=measurements, rounding=rounding, notes=notes, info=info)
    if transcript is not None:
        from dpopt.algorithms.transcript import transcript_frame

        release["transcript"] = transcript_frame(measurements, ([None] if count is not None else []) + list(transcript))
    return release
