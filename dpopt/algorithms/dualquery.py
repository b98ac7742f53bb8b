"""DualQuery: a zero-sum game between a query player and a data player (Gaboardi et al., ICML 2014).

Algorithm 1 of the paper, over a workload of counting queries (conjunctions of
``attribute = value`` literals, every cell of every k-way marginal by default, or random
k-way conjunctions as in the paper's experiments) and their negations:

* the **query player** runs multiplicative weights with rate η over the rows: in round ``t``
  its distribution is ``Q_t(q) ∝ exp(η Σ_{i<t} (q(D) - q(x_i)))``, and it samples ``s``
  rows from it (exactly: :mod:`dpopt.privacy.exp_weights`);
* the **data player** answers with the record ``x_t`` that satisfies the most sampled rows,
  an integer program over the domain's one-hot value binaries with the structural zeros as
  constraints (:func:`dpopt.estimate.engines.best_response.best_response`; HiGHS by default, CBC
  through PuLP by name), with a time limit per round.

The synthetic dataset is ``x_1..x_T``. Privacy comes from the sampling alone and is charged
to the accountant as ONE (ε, δ) cost before any sampling (:mod:`dpopt.algorithms.dualquery_privacy`):
one of ``T`` and ``s`` is solved from the budget when not given. The data's answers ``q(D)``
are computed once, from the records, without materialising the domain.

Per round the release reports the integer program's status, score, bound, gap and time; a
time-out keeps the incumbent, and a round without any incumbent (or whose point does not
decode to an allowed record) keeps the previous round's record (in round 1: an allowed
record found by a feasibility solve of the single-record constraints alone), and says so.
Neither changes the privacy guarantee, which never looks at the records' quality.

Output: the ``T`` records (``records``; their multiplicities in ``info["multiplicities"]``)
and, when the domain is small enough, ``counts``: the records' histogram scaled to the public
``n`` (each synthetic record stands for ``n/T`` records), rounded keeping the total when the
constraints declare integrality, or, with ``project = True``, projected through
:func:`dpopt.estimate.reconstruct` onto the invariants, structural zeros and non-negativity
(documented post-processing; the unprojected records stay in ``records``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import pandas as pd

from dpopt.algorithms.base import Algorithm, AlgorithmParams, PlannedMeasure, Release, make_release, register
from dpopt.algorithms.base import round_release
from dpopt.algorithms.dualquery_privacy import (
    QueryPlayer,
    dualquery_epsilon,
    solve_rounds,
    solve_samples,
)
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
from dpopt.estimate.engines.best_response import MIP_BACKENDS, RecordProgram, best_response
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet, Invariant
from dpopt.model.data import Dataset, decode_codes
from dpopt.model.domain import Domain
from dpopt.model.queries.literal_conjunctions import Conjunctions
from dpopt.privacy.accountant import Accountant, as_fraction
from dpopt.privacy.budget import Budget
from dpopt.privacy.randomness import RandomSource

__all__ = ["DualQuery", "DualQueryParams", "dualquery", "build_workload", "DUALQUERY_REFERENCE", "WORKLOADS"]

DUALQUERY_REFERENCE = ("Gaboardi, Gallego Arias, Hsu, Roth, Wu, Dual Query: Practical Private Query Release for "
                       "High Dimensional Data, ICML 2014 (arXiv:1402.1526), Algorithm 1; privacy: advanced "
                       "composition of the query samples (Dwork, Rothblum, Vadhan 2010, Thm III.3)")

#: Named workloads: every cell of the k-way marginals, or random k-way conjunctions (paper's Sec. 5).
WORKLOADS = ("marginals", "random")
#: Default largest table (cells) released as ``counts`` next to the records.
TABLE_CELLS = 10**6
#: The game of :meth:`DualQuery.resized` (the privacy audit's datasets of a few records).
AUDIT_ROUNDS, AUDIT_SAMPLES, AUDIT_QUERIES = 3, 4, 10_000
#: Default work budget of a round's integer program (calls of HiGHS's MIP interrupt callback). On
#: 23 KDD99 rounds 10 calls cost 5.1 CPU-s against 21 for 40, for 0.05 % fewer sampled queries
#: satisfied: from a warm start the record is found early, most of the rest is proving it optimal.
WORK_LIMIT = 10
#: Record programs with at least this many value binaries run without HiGHS's presolve (KDD99's 419:
#: presolve cost three quarters of the solve); smaller ones keep it (3 binary attributes, 6 values:
#: 1.5x the CPU without it, in the audit's 600 runs). Sizes in between were not measured.
PRESOLVE_OFF_VALUES = 64


# ---- parameters ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DualQueryParams(AlgorithmParams):
    """``[dualquery]``: the workload, the game's parameters and the data player's solver.

    Attributes
    ----------
    workload : {"marginals", "random"} or Conjunctions
        Every cell of every ``order``-way marginal, or ``queries`` random ``order``-way
        conjunctions (uniform attribute sets and values, drawn with the public
        ``workload_seed``); or, from Python, any :class:`~dpopt.model.queries.Conjunctions`.
        Negations are always added.
    order : int
        ``k``, the number of literals.
    queries : int
        Number of random conjunctions (``workload = "random"``), negations not counted.
    workload_seed : int
        Seed of the random workload (public; the workload is not secret).
    attributes : tuple of str, optional
        Build the workload over these attributes only (default: all).
    eta : number
        The query player's learning rate η (exact rational; ``1.2`` means 6/5).
    rounds : int, optional
        ``T``; solved from the budget when None.
    samples : int, optional
        ``s``, queries sampled per round; solved from the budget when None. Give at least one
        of ``rounds`` and ``samples``; with both, their guarantee must fit the budget.
    solver : {"highs", "pulp"}
        MILP backend of the data player.
    time_limit : float
        Seconds of CPU time per round's integer program (HiGHS: this process's CPU time, read in
        the solver's callback, so that a loaded machine does not cut a round short; PuLP: CBC's
        own limit); a time-out keeps the incumbent. A backstop: ``work_limit`` ends rounds first.
    work_limit : int
        HiGHS: the work each round's integer program may do (calls of HiGHS's MIP interrupt
        callback: root cut rounds and nodes) before it returns its incumbent. It counts solver
        events, not seconds, so the game's path depends on the data and the seed only, never on
        the machine's load.
    mip_gap : float
        Relative gap at which a round's solve stops.
    records : int, optional
        The public record count ``n``; default: the data's count (treated as public, as in the
        paper).
    project : bool
        Project the records' table onto the constraints (invariants, structural zeros,
        non-negativity) with :func:`dpopt.estimate.reconstruct`; needed to keep invariants.
    table_cells : int
        Largest domain (cells) for which ``counts`` is released next to the records.
    count_share : Fraction, optional
        None (default): the record count is public, as in the paper. A share in (0, 1): the
        count is measured with that share of ε first and the game runs with the noisy count as
        ``n`` on the rest (:mod:`dpopt.algorithms.record_count`); excludes ``records``.
    transcript : bool
        Also release the measurement transcript (:mod:`dpopt.algorithms.transcript`): the noisy
        record count exactly as drawn (with ``count_share``; empty with the public n). No
        privacy cost and no other output changes; it lets an audit see the count's low-order
        bits, which the integer ``n`` the game uses hides. The query samples are not in it
        (``T·s`` rows; the records are the data player's best responses to them). Default False.
    """

    workload: str | Conjunctions = "marginals"
    order: int = 2
    queries: int = 10_000
    workload_seed: int = 0
    attributes: tuple[str, ...] | None = None
    eta: Fraction | float | str = Fraction(1)
    rounds: int | None = None
    samples: int | None = 1000
    solver: str = "highs"
    time_limit: float = 30.0
    work_limit: int = WORK_LIMIT
    mip_gap: float = 1e-6
    records: int | None = None
    project: bool = False
    table_cells: int = TABLE_CELLS
    count_share: Fraction | None = None
    transcript: bool = False

    def validate(self) -> None:
        object.__setattr__(self, "count_share", check_count_share(self.count_share))
        if not isinstance(self.transcript, bool):
            raise ParameterError(f"transcript must be true or false, got {self.transcript!r}")
        if self.count_share is not None and self.records is not None:
            raise ParameterError("give records (a public n) or count_share (a noisy n), not both")
        if isinstance(self.workload, str):
            if self.workload not in WORKLOADS:
                raise ParameterError(f"workload must be one of {list(WORKLOADS)} (or a Conjunctions workload), "
                                     f"got {self.workload!r}")
        elif not isinstance(self.workload, Conjunctions):
            raise ParameterError(f"workload must be one of {list(WORKLOADS)} or a Conjunctions workload, got "
                                 f"{type(self.workload).__name__}")
        for name in ("order", "queries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ParameterError(f"{name} must be a positive integer, got {name}={value!r}")
        if isinstance(self.workload_seed, bool) or not isinstance(self.workload_seed, (int, np.integer)):
            raise ParameterError(f"workload_seed must be an integer, got {self.workload_seed!r}")
        if self.attributes is not None and (isinstance(self.attributes, str) or not self.attributes
                                            or not all(isinstance(a, str) for a in self.attributes)):
            raise ParameterError(f"attributes must be a non-empty list of attribute names, got {self.attributes!r}")
        try:
            eta = as_fraction(self.eta, "eta")
        except PrivacyParameterError as exc:
            raise ParameterError(str(exc)) from None
        if eta <= 0:
            raise ParameterError(f"eta must be > 0, got eta={self.eta!r}")
        object.__setattr__(self, "eta", eta)
        if self.attributes is not None:
            object.__setattr__(self, "attributes", tuple(self.attributes))
        if self.rounds is None and self.samples is None:
            raise ParameterError("give rounds or samples (or both): the one left out is solved from the budget")
        if self.rounds is not None and (isinstance(self.rounds, bool) or not isinstance(self.rounds, (int, np.integer))
                                        or self.rounds < 2):
            raise ParameterError(f"rounds must be an integer >= 2 (round 1 alone samples uniformly), "
                                 f"got rounds={self.rounds!r}")
        if self.samples is not None and (isinstance(self.samples, bool)
                                         or not isinstance(self.samples, (int, np.integer)) or self.samples < 1):
            raise ParameterError(f"samples must be a positive integer, got samples={self.samples!r}")
        if self.solver not in MIP_BACKENDS:
            raise ParameterError(f"solver must be one of {list(MIP_BACKENDS)}, got solver={self.solver!r}")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or not self.time_limit > 0:
            raise ParameterError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")
        if isinstance(self.work_limit, bool) or not isinstance(self.work_limit, (int, np.integer)) \
                or self.work_limit < 1:
            raise ParameterError(f"work_limit must be a positive integer, got {self.work_limit!r}")
        if isinstance(self.mip_gap, bool) or not isinstance(self.mip_gap, (int, float)) or not 0 <= self.mip_gap < 1:
            raise ParameterError(f"mip_gap must be in [0, 1), got {self.mip_gap!r}")
        if self.records is not None and (isinstance(self.records, bool)
                                         or not isinstance(self.records, (int, np.integer)) or self.records < 1):
            raise ParameterError(f"records must be a positive integer (the public n), got {self.records!r}")
        if not isinstance(self.project, bool):
            raise ParameterError(f"project must be true or false, got {self.project!r}")
        if isinstance(self.table_cells, bool) or not isinstance(self.table_cells, (int, np.integer)) \
                or self.table_cells < 1:
            raise ParameterError(f"table_cells must be a positive integer, got {self.table_cells!r}")

    @classmethod
    def from_spec(cls, reader) -> "DualQueryParams":
        t = reader.table("dualquery", required=True)
        attrs = t.str_list("attributes", default=None) if t.has("attributes") else None
        eta = t.budget("eta") if t.has("eta") else Fraction(1)
        rounds = t.int("rounds", default=None, minimum=2)
        samples = t.int("samples", default=None, minimum=1)
        if rounds is None and samples is None:
            samples = 1000
        return cls(workload=t.str("workload", default="marginals", choices=WORKLOADS),
                   order=t.int("order", default=2, minimum=1), queries=t.int("queries", default=10_000, minimum=1),
                   workload_seed=t.int("workload_seed", default=0), attributes=tuple(attrs) if attrs else None,
                   eta=eta, rounds=rounds, samples=samples,
                   solver=t.str("solver", default="highs", choices=MIP_BACKENDS),
                   time_limit=t.float("time_limit", default=30.0, positive=True),
                   work_limit=t.int("work_limit", default=WORK_LIMIT, minimum=1),
                   mip_gap=t.float("mip_gap", default=1e-6),
                   records=t.int("records", default=None, minimum=1),
                   project=t.bool("project", default=False),
                   table_cells=t.int("table_cells", default=TABLE_CELLS, minimum=1),
                   count_share=t.budget("count_share", unit=True), transcript=t.bool("transcript", default=False))


def build_workload(domain: Domain, params: DualQueryParams) -> Conjunctions:
    """The workload rows (the conjunctions followed by their negations)."""
    w = params.workload
    if isinstance(w, Conjunctions):
        if w.domain != domain:
            raise QueryError(f"the workload is over {w.domain}, not {domain}")
        return w.with_negations() if not w.negated.any() else w
    attrs = params.attributes if params.attributes is not None else domain.attrs
    domain.check_attrs(attrs)
    if params.order > len(attrs):
        raise QueryError(f"order {params.order} exceeds the {len(attrs)} attributes of the workload")
    if w == "random":
        base = Conjunctions.random(domain, params.order, params.queries, params.workload_seed, attrs)
    else:
        from itertools import combinations

        base = Conjunctions.marginal_cells(domain, [tuple(c) for c in combinations(attrs, params.order)])
    return base.with_negations()


# ---- the registered algorithm -------------------------------------------------------------------
@register
class DualQuery(Algorithm):
    """DualQuery (module notes): synthetic records from a game between MW over queries and an IP oracle."""

    name = "dualquery"
    title = "synthetic records from a game between multiplicative weights over queries and an integer-program oracle"
    reference = DUALQUERY_REFERENCE
    dense_domain = False
    accountings = ("approx",)
    supports = frozenset({"nonnegative", "integer", "structural_zeros", "hierarchy", "invariants"})
    sections = {"dualquery": ("workload", "order", "queries", "workload_seed", "attributes", "eta", "rounds",
                              "samples", "solver", "time_limit", "work_limit", "mip_gap", "records", "project",
                              "table_cells", "count_share", "transcript")}
    Params = DualQueryParams

    @classmethod
    def check_accounting(cls, accounting: str) -> None:
        if accounting not in cls.accountings:
            raise ParameterError(
                f"algorithm = 'dualquery' runs under (epsilon, delta)-DP (accounting = \"approx\"), not accounting = "
                f"\"{accounting}\": its privacy proof (Gaboardi et al. 2014) composes the query samples with "
                "advanced composition, and dpopt implements no cited pure-DP or zCDP guarantee for it")

    # ---- plan ---------------------------------------------------------------------------------
    def plan(self, domain, constraints, budget):
        p = self.params
        try:
            workload = build_workload(domain, p)
        except (DpoptError, ValueError) as exc:
            raise at_key(QueryError(str(exc)), ("dualquery", "workload")) from None
        if constraints.invariants and not p.project:
            raise at_key(ParameterError(
                "dualquery releases records, which cannot keep invariants by themselves; set project = true to "
                "project the records' table onto them"), ("dualquery", "project"))
        if (constraints.invariants or p.project) and domain.size > p.table_cells:
            raise at_key(ParameterError(
                f"the projection needs a table of {domain.size:.3g} cells, above table_cells = {p.table_cells}"),
                ("dualquery", "project"))
        program = RecordProgram(domain, constraints)
        program.any_record(p.solver, time_limit=p.time_limit)  # public: is any record allowed at all?
        rest = rest_of_budget(budget, p.count_share)
        game = None if p.records is None else game_size(p, rest, p.records)
        step = PlannedMeasure(
            "dualquery: query samples", None, "sampling", Fraction(1), rest.total,
            what="s rows per round from the query player's multiplicative-weights distribution",
            answers=None if game is None else game[0] * game[1])
        steps = scale_shares([step], p.count_share)
        if p.count_share:
            steps.insert(0, count_step(domain, budget, p.count_share))
        lines = [f"workload: {workload.num_rows:,} rows ({workload.num_rows // 2:,} conjunctions of up to "
                 f"{int(workload.arity.max())} literals and their negations)",
                 f"learning rate eta = {p.eta}; " + (
                     f"T = {game[0]} rounds of s = {game[1]} samples, epsilon = {float(game[2]):.6g} at delta = "
                     f"{budget.delta}" if game is not None else
                     "T or s solved at run time from the " + ("noisy" if p.count_share else "public") +
                     " record count n"),
                 f"data player: {p.solver} MILP per round" + (f", work limit {p.work_limit}" if p.solver == "highs" else "")
                 + f", {p.time_limit:g} {'CPU-' if p.solver == 'highs' else ''}s limit, {program.num_values} value "
                 "binaries; warm-started from the earlier rounds' records",
                 f"the record count n is measured with noise ({p.count_share} of epsilon)" if p.count_share else
                 "the record count n is treated as public (Gaboardi et al. 2014)"]
        return self.new_plan(domain, constraints, budget, steps=steps, details=workload, lines=lines)

    # ---- run ----------------------------------------------------------------------------------
    def run(self, plan, data, accountant, rng) -> Release:
        p = self.params
        workload: Conjunctions = plan.details
        if data.domain != plan.domain:
            raise QueryError(f"the data are over {data.domain}, not the plan's {plan.domain}")
        count, n = measure_count(plan.steps[0], data, accountant, rng) if p.count_share else (None, None)
        n = int(n if count is not None else p.records if p.records is not None else data.total)
        if n < 1:
            raise ParameterError("dualquery needs at least one record (n >= 1)")
        rest = rest_of_budget(plan.budget, p.count_share)
        rounds, samples, epsilon = game_size(p, rest, n)
        cost = rest.total
        accountant.charge(cost, "dualquery: query samples", detail={
            "rounds": rounds, "samples": samples, "eta": str(p.eta), "records": n,
            "epsilon_of_the_guarantee": str(epsilon), "delta": str(plan.budget.delta),
            "theorem": "advanced composition of s(T-1) samples, each 2 eta (T-1)/n-DP"})
        game = play(workload, data, n, p.eta, rounds, samples, RecordProgram(plan.domain, plan.constraints), rng,
                    solver=p.solver, time_limit=p.time_limit, work_limit=p.work_limit, mip_gap=p.mip_gap)
        return self._release(plan, accountant, game, n, rounds, samples, epsilon, count)

    def _release(self, plan, accountant, game, n, rounds, samples, epsilon, count=None) -> Release:
        p = self.params
        domain, constraints = plan.domain, plan.constraints
        records = decode_codes(game.records, domain)
        distinct, mult = np.unique(game.records, axis=0, return_counts=True)
        multiplicities = decode_codes(distinct, domain)
        multiplicities["count"] = mult
        log = game.log
        n_opt = int((log["status"] == Status.OPTIMAL.name).sum())
        n_time = int((log["status"] == Status.TIME_LIMIT.name).sum())
        n_work = int((log["status"] == Status.ITERATION_LIMIT.name).sum())
        n_fall = int(log["fallback"].sum())
        measured = [count] if count is not None else []
        notes = [
            count_note(n, p.count_share) if count is not None else
            PUBLIC_N_NOTE.format(n=n, where="the scale of the released counts"),
            f"Privacy: T = {rounds} rounds of s = {samples} queries sampled from the query player's distribution; "
            f"the guarantee is (epsilon, delta) = ({float(epsilon):.6g}, {plan.budget.delta}) by advanced "
            "composition (derived in docs/pages/algorithms/dualquery.md), within the budget charged.",
            "The integer programs see only the sampled queries: their time-outs, gaps and fallbacks do not change "
            "the privacy guarantee, only the records' quality.",
            f"Best responses: {n_opt} of {rounds} proved optimal, "
            + (f"{n_work} stopped at the work limit ({p.work_limit}), " if p.solver == "highs" else "")
            + f"{n_time} at the {p.time_limit:g} {'CPU-' if p.solver == 'highs' else ''}s limit, {n_fall} used the "
            "fallback (the previous record). Each round's integer program starts from the best earlier record, "
            "improved attribute by attribute.",
        ]
        counts, reconstruction, rounding = None, None, None
        if domain.size <= p.table_cells:
            h = np.bincount(domain.ravel(game.records), minlength=domain.size).astype(np.float64)
            scaled = h * (n / rounds)
            holds = all(r["max_violation"] <= 1e-9 for r in constraints.residuals(scaled)
                        if not r["constraint"].startswith("integer:"))
            if p.project and not holds:
                counts, reconstruction, failure = _project(scaled, constraints, n)
                notes.append("counts: the records' table scaled to n, projected (least squares) onto the constraints "
                             "by dpopt.estimate.reconstruct; the records themselves are not projected.")
            else:
                cs = ConstraintSet(domain, list(constraints.constraints))
                if constraints.integral:
                    from dpopt.model.queries.basic import Total

                    cs.add(Invariant(Total(domain), np.array([float(n)]), name="total (public n in DualQuery)"))
                counts, rounding, failure = round_release(scaled, cs)
                notes.append("counts: the records' table scaled to n (each record stands for n/T records)"
                             + (", rounded to integers keeping the total n." if constraints.integral else ".")
                             + (" It already met every constraint, so no projection was needed." if p.project else ""))
            if failure is not None:
                return self._with_transcript(make_release(
                    self, plan, accountant, status=Status.NUMERICAL_ERROR, message=failure, records=records,
                    reconstruction=reconstruction, rounding=rounding, notes=notes, measurements=measured,
                    info={"rounds_log": log, "spec_key": ("dualquery", "project")}))
        info = {"rounds": rounds, "samples": samples, "eta": str(p.eta), "records": n,
                "epsilon_of_the_guarantee": str(epsilon), "delta": str(plan.budget.delta),
                "workload_rows": plan.details.num_rows, "rounds_log": log, "multiplicities": multiplicities,
                "record_codes": game.records,
                "ip_time_median": float(log["time"].median()), "ip_time_max": float(log["time"].max()),
                "ip_timeouts": n_time, "ip_work_limits": n_work, "fallbacks": n_fall, "timings": game.timings}
        return self._with_transcript(make_release(
            self, plan, accountant, status=Status.COMPLETED,
            message=f"dualquery ran its {rounds} rounds (no optimality claim: the records are the data player's "
                    f"best responses; {n_opt} proved optimal)",
            counts=counts, records=records, reconstruction=reconstruction, rounding=rounding, measurements=measured,
            notes=notes, info=info))

    def _with_transcript(self, release: Release) -> Release:
        """``release`` with its measurement transcript when the option asks for it (the noisy
        record count: :mod:`dpopt.algorithms.transcript`)."""
        if self.params.transcript:
            from dpopt.algorithms.transcript import transcript_frame

            release["transcript"] = transcript_frame(release.measurements)
        return release

    def resized(self, records, budget):
        """The game sized for datasets of a few records (the privacy audit's); the rule:

        ``ε_0 = 2η(T-1)/n`` grows as ``n`` shrinks, so a game sized for the data's ``n`` (KDD99:
        ``η = 1.2``, ``s = 1750`` for ``n = 494,021``) cannot be played within the budget on a
        few records. When the spec's game does not fit at ``n = 1`` (the smallest count a run
        can use), the audit plays ``T = min(T, 3)`` rounds with ``s`` solved from the budget at
        run time, as DualQuery does when ``samples`` is left out, and ``η`` halved from the
        spec's until ``s >= 4`` samples fit at ``n = 1``; a random workload is capped at 10,000
        conjunctions (time only: a domain of a few hundred cells has few distinct ones). The
        privacy argument is unchanged: it holds for every ``η``, ``T`` and ``s`` it is given.
        """
        p = self.params
        rest = rest_of_budget(budget, p.count_share)
        try:
            game_size(p, rest, p.records or 1)
            return self, None
        except ParameterError:
            pass
        rounds = min(p.rounds or AUDIT_ROUNDS, AUDIT_ROUNDS)
        eta = p.eta
        while eta > Fraction(1, 2**40):
            try:
                if solve_samples(rest.epsilon, eta, rounds, 1, rest.delta) >= AUDIT_SAMPLES:
                    break
            except ParameterError:
                pass
            eta /= 2
        small = replace(p, rounds=rounds, samples=None, eta=eta, queries=min(p.queries, AUDIT_QUERIES))
        return DualQuery(small), (f"dualquery resized for datasets of a few records (the spec's game needs "
                                  f"n >> 1): eta {p.eta} -> {eta}, T = {rounds} rounds, s solved from the budget at "
                                  f"run time ({AUDIT_SAMPLES} at n = 1)"
                                  + (f", {small.queries:,} random conjunctions" if small.queries < p.queries
                                     and p.workload == "random" else ""))

    @classmethod
    def example(cls, domain):
        # A small eta keeps s >= 1 within a unit budget down to about ten records; the projection
        # (which keeps invariants) needs a table, so it is asked for on small domains only.
        return cls.Params(order=min(2, len(domain)), eta=Fraction(1, 10), rounds=3, samples=None, time_limit=10.0,
                          project=domain.size <= TABLE_CELLS)


def game_size(params: DualQueryParams, budget: Budget, records: int) -> tuple[int, int, Fraction]:
    """``(T, s, epsilon)``: the rounds and samples of a run within ``budget``, and its guarantee's ε."""
    if budget.accounting != "approx":
        DualQuery.check_accounting(budget.accounting)
    eps, delta = budget.epsilon, budget.delta
    try:
        if params.rounds is None:
            rounds, samples = solve_rounds(eps, params.eta, params.samples, records, delta), params.samples
        elif params.samples is None:
            rounds, samples = params.rounds, solve_samples(eps, params.eta, params.rounds, records, delta)
        else:
            rounds, samples = params.rounds, params.samples
    except ParameterError as exc:
        raise at_key(exc, ("dualquery", "rounds" if params.rounds is None else "samples")) from None
    epsilon = dualquery_epsilon(params.eta, rounds, samples, records, delta)
    if epsilon > eps:
        raise at_key(ParameterError(
            f"T = {rounds} rounds of s = {samples} samples (eta = {params.eta}, n = {records}) need epsilon = "
            f"{float(epsilon):.6g} at delta = {delta}, above the budget's {float(eps):.6g}; leave rounds or samples "
            "out to have it solved"), ("dualquery", "samples"))
    return rounds, samples, epsilon


# ---- the game ------------------------------------------------------------------------------------
@dataclass
class GameLog:
    """What :func:`play` returns: the records, one row per round of the log, and timings."""

    records: np.ndarray
    log: pd.DataFrame
    timings: dict


def play(workload: Conjunctions, data: Dataset, n: int, eta, rounds: int, samples: int, program: RecordProgram,
         rng: RandomSource, *, solver: str = "highs", time_limit: float | None = None,
         work_limit: int | None = WORK_LIMIT, mip_gap: float = 1e-6, oracle=None,
         progress: bool | None = None) -> GameLog:
    """Run the game (the privacy cost must already be charged).

    Each round's integer program starts from the earlier rounds' records (the best on the new
    sample and the last, improved attribute by attribute: :func:`best_response`'s ``start``).
    With HiGHS, ``work_limit`` bounds its work and ``time_limit`` its CPU seconds (a backstop);
    neither depends on wall-clock time, so a loaded machine plays the same game.
    ``oracle(program, sampled_rows, multiplicity) -> BestResponse`` replaces the integer program
    (tests use a random oracle to show that the sampling law does not depend on it).
    """
    from tqdm import tqdm

    timings = {"answers": 0.0, "sampling": 0.0, "best_response": 0.0, "update": 0.0}
    tick = time.perf_counter()
    player = QueryPlayer(workload.count_records(data.codes, data.weights), n, eta)  # q(D), once
    timings["answers"] = time.perf_counter() - tick
    records = np.zeros((rounds, len(workload.domain)), dtype=np.int64)
    rows = []
    previous = None
    for t in tqdm(range(rounds), desc="dualquery", unit="round", disable=True if progress is False else None,
                  leave=False):
        tick = time.perf_counter()
        drawn = player.sample(samples, rng)
        distinct, mult = np.unique(drawn, return_counts=True)
        timings["sampling"] += time.perf_counter() - tick
        tick = time.perf_counter()
        sampled = workload.rows(distinct)
        if oracle is None:
            # Round 1 starts from the all-zero record improved on its sample (if allowed).
            start = records[:t] if t else np.zeros((1, records.shape[1]), dtype=np.int64)
            br = best_response(program, sampled, mult, backend=solver, mip_gap=mip_gap, start=start,
                               **_limits(solver, time_limit, work_limit, program.num_values))
        else:
            br = oracle(program, sampled, mult)
        fallback = br.codes is None
        if fallback:
            record = previous if previous is not None else program.any_record(solver, time_limit=time_limit)
        else:
            record = br.codes
        timings["best_response"] += time.perf_counter() - tick
        tick = time.perf_counter()
        player.update(workload.satisfied(record))
        timings["update"] += time.perf_counter() - tick
        records[t] = record
        previous = record
        rows.append({"round": t + 1, "status": br.status.name, "score": br.score, "bound": br.bound, "gap": br.gap,
                     "time": br.time, "work": br.info.get("work"), "start_score": br.info.get("start_score"),
                     "fallback": fallback, "distinct_queries": int(distinct.size)})
    return GameLog(records, pd.DataFrame(rows), timings)


def _limits(solver: str, time_limit: float | None, work_limit: int | None, num_values: int) -> dict:
    """The best response's limits: HiGHS counts work and CPU seconds (load-independent); CBC
    (PuLP) has only its own time limit. HiGHS runs without presolve on programs of at least
    :data:`PRESOLVE_OFF_VALUES` value binaries, where presolve cost three quarters of the solve
    (KDD99: 5.6 against 1.6 CPU-s on 12 rounds); tiny programs are faster with it."""
    if solver != "highs":
        return {"time_limit": time_limit}
    options = {"presolve": num_values < PRESOLVE_OFF_VALUES}
    if time_limit is not None:
        options["cpu_limit"] = float(time_limit)
    return {"work_limit": work_limit, "options": options}


def _project(scaled: np.ndarray, constraints: ConstraintSet, n: int):
    """Least-squares projection of the records' scaled table onto the constraints (post-processing)."""
    from dpopt.estimate import reconstruct
    from dpopt.model.measurement import Measurement
    from dpopt.model.queries.basic import Identity, Total

    domain = constraints.domain
    cs = ConstraintSet(domain, list(constraints.constraints))
    if not constraints.nonnegative:
        from dpopt.model.constraints import NonNegativity

        cs.add(NonNegativity())
    if constraints.integral and not any(isinstance(c.query, Total) for c in cs.invariants):
        cs.add(Invariant(Total(domain), np.array([float(n)]), name="total (public n in DualQuery)"))
    table = Measurement(Identity(domain), scaled, "none", 1.0, 1.0, label="dualquery records' table (scaled to n)",
                        info={"note": "not a noisy measurement: the synthetic records' table, unit weight"})
    result = reconstruct([table], cs, "l2")
    if not result.success or result.x is None:
        return None, result, f"the projection of the records' table ended with status {result.status}: {result.message}"
    x = np.asarray(result.x, dtype=np.float64)
    counts = np.rint(x).astype(np.int64) if constraints.integral else x
    return counts, result, None


# ---- convenience --------------------------------------------------------------------------------
def dualquery(data: Dataset, epsilon, delta, *, accountant: Accountant | None = None,
              rng: RandomSource | None = None, constraints: ConstraintSet | None = None, **params) -> Release:
    """Run DualQuery on ``data`` at (``epsilon``, ``delta``) (the top-level convenience form).

    ``params`` are the fields of :class:`DualQueryParams` (``workload``, ``order``, ``eta``,
    ``rounds``, ``samples``, ``solver``, ``time_limit``, ...). ``rng`` defaults to a fresh secure
    source; ``accountant`` to one holding exactly the budget.
    """
    from dpopt.privacy.randomness import make_random

    budget = Budget.approx(epsilon, delta)
    algorithm = DualQuery(**params)
    cs = constraints if constraints is not None else ConstraintSet(data.domain)
    plan = algorithm.plan(data.domain, cs, budget)
    return algorithm.run(plan, data, accountant if accountant is not None else budget.accountant(),
                         rng if rng is not None else make_random())
