"""The audit harness: neighbouring datasets, event search, then a one-sided test on fresh runs.

:func:`audit` runs three phases on an :class:`~dpopt.audit.targets.AuditTarget`, each on runs of
its own (a run's seed is derived from the phase, the dataset and the chunk, so an audit is
reproducible and the phases never share a run):

0. **disclosure sweep**: pairs that together change every cell (:func:`~dpopt.audit.neighbours.covering_pairs`)
   are run :data:`SWEEP_RUNS` times per dataset, as many as the event search's runs pay for, to
   find exact disclosures (an answer released without noise shows in a few runs); the first
   pair that discloses goes on to the event search first (whose runs confirm it or not);
1. **screening** (worst-case search over pairs): every distinct dataset of the candidate pairs
   (:mod:`dpopt.audit.neighbours`) is run ``screen_runs`` times and each pair is scored by the
   best event found on its runs; the ``keep_pairs`` best pairs go on;
2. **event search** (StatDP's event selection, Ding et al. CCS 2018): half of ``runs`` on each
   dataset of each kept pair; candidate events are proposed on the first half of these runs
   (:func:`dpopt.audit.events.search_events`) and ranked again on the second half, and the most
   telling (pair, event) is chosen;
3. **test**: the other half of ``runs``, fresh, on the chosen pair: a Clopper–Pearson lower
   bound on ε (δ-thinned when δ > 0), the power of that test (the smallest excess over the
   claim it detects with 95% probability, :func:`dpopt.audit.stats.detectable_excess`) and
   Fisher's exact test at the claimed ε as a second opinion (:mod:`dpopt.audit.stats`). One
   test, so its confidence needs no correction for the search: the search only chose *which*
   test to run. With ``runs = "auto"`` the test's size is chosen from the search's
   frequencies for a requested excess, within a time budget.

Every run's ledger is checked (:func:`dpopt.audit.targets.ledger_problem`). A statistic that
takes one value on every run of one dataset and another on every run of its neighbour is an
*exact disclosure*; when it is the record count, the audit continues conditional on it (the
``move`` relation, against the group guarantee) and reports both.

Runs are spread over worker processes (``workers``; forked, so the target is not pickled;
they die with the audit, :func:`dpopt.workers.die_with_parent`): each phase sends the chunks of
all its datasets at once, so every worker stays busy.
Randomness: each chunk of runs draws from a :class:`~dpopt.privacy.randomness.SeededRandom`
(reproducible and NOT private) -- acceptable here and only here, because an audit publishes
statistics of synthetic datasets, never a release.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from dpopt.audit.claims import Claim
from dpopt.audit.defaults import DEFAULT_EXCESS, DEFAULT_RUNS, DEFAULT_TIME_BUDGET
from dpopt.audit.events import Candidate, exact_disclosures, rank, scored, search_events
from dpopt.audit.neighbours import add_remove_pairs, cell_labels, covering_pairs, limit_pairs, move_pairs
from dpopt.audit.report import AuditReport
from dpopt.audit.stats import detectable_excess, epsilon_lower_bound, fisher_pvalue, runs_for_excess
from dpopt.audit.targets import AuditTarget
from dpopt.errors import ParameterError
from dpopt.model.data import Dataset
from dpopt.privacy.randomness import SeededRandom
from dpopt.workers import die_with_parent

__all__ = ["audit", "default_screen_runs", "default_max_pairs", "DEFAULT_RUNS", "DEFAULT_SCREEN_RUNS",
           "AUTO_SEARCH_RUNS", "DEFAULT_EXCESS", "DEFAULT_TIME_BUDGET"]

#: Runs of each candidate dataset in the screening of pairs.
DEFAULT_SCREEN_RUNS = 300
#: Runs per work item (a chunk shares one seeded source; small enough to keep every worker busy).
CHUNK = 50
#: ``runs = "auto"``: runs of each dataset of a kept pair in the event search (half propose, half rank).
AUTO_SEARCH_RUNS = 2000
#: The fewest test (and, in auto mode, search) runs per dataset, the fewest screening runs per
#: dataset in auto mode, and the runs timed before an audit to estimate its length.
MIN_TEST_RUNS, MIN_SCREEN_RUNS, PILOT_RUNS = 100, 20, 3
_PHASES = {"probe": 0, "screen": 1, "search": 2, "test": 3, "sweep": 4}
#: Runs per dataset of the disclosure sweep (module notes).
SWEEP_RUNS = 4

_TARGET: AuditTarget | None = None  # the target of the running audit, inherited by forked workers


def audit(target: AuditTarget, *, runs: int | str = DEFAULT_RUNS, screen_runs: int | None = None,
          max_records: int = 2, max_pairs: int | None = None, keep_pairs: int = 2, alpha: float = 0.05,
          workers: int | None = 1, seed: int = 0, progress: bool = False, excess: float = DEFAULT_EXCESS,
          time_budget: float = DEFAULT_TIME_BUDGET, echo=None) -> AuditReport:
    """Audit ``target`` (module notes) and return an :class:`~dpopt.audit.report.AuditReport`.

    Parameters
    ----------
    target : AuditTarget
        E.g. :class:`~dpopt.audit.targets.AlgorithmTarget` or a mechanism of
        :mod:`dpopt.audit.mechanisms`.
    runs : int or "auto"
        Runs of each of the two datasets of the chosen pair (half search, half test). ``"auto"``:
        the search runs :data:`AUTO_SEARCH_RUNS` per dataset, then the test gets the runs that
        detect an excess of ``excess · ε`` over the claim with 95% probability
        (:func:`~dpopt.audit.stats.runs_for_excess`), as many as ``time_budget`` allows.
    screen_runs : int, optional
        Runs of each candidate dataset when there are more candidate pairs than ``keep_pairs``
        (0: no screening, the first ``keep_pairs`` pairs go on). Default: ``runs / 20``, between
        20 and :data:`DEFAULT_SCREEN_RUNS`.
    max_records : int
        The worst-case search covers every dataset of up to this many records.
    max_pairs : int, optional
        At most this many candidate pairs are screened. Default: ``runs / 400``, between 4 and 24
        (screening then costs no more than the search).
    keep_pairs : int
        Pairs carried from screening into the event search.
    alpha : float
        The test's confidence is ``1 - alpha``.
    workers : int or None
        Worker processes (None: every core).
    seed : int
        Seed of the audit's runs (the audit is reproducible; it publishes no release).
    progress : bool
        A progress bar on standard error.
    excess, time_budget : float
        ``runs = "auto"`` only: the excess over the claim to detect, as a fraction of the
        claimed ε, and the seconds the whole audit may take.
    echo : callable, optional
        Receives the time estimates (e.g. ``print``).
    """
    auto = runs == "auto"
    size = AUTO_SEARCH_RUNS if auto else runs
    if screen_runs is None:
        screen_runs = default_screen_runs(size)
    if max_pairs is None:
        max_pairs = default_max_pairs(size)
    for name, value, low in (("runs", size, 4), ("screen_runs", screen_runs, 0), ("max_records", max_records, 1),
                             ("max_pairs", max_pairs, 1), ("keep_pairs", keep_pairs, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ParameterError(f"audit: {name} must be an integer >= {low} (or runs = \"auto\"), got {value!r}")
    if not 0 < alpha < 1:
        raise ParameterError(f"audit: alpha must lie in (0, 1), got {alpha!r}")
    if auto and not (excess > 0 and time_budget > 0):
        raise ParameterError(f"audit: runs = \"auto\" needs excess > 0 and time_budget > 0, got {excess!r}, "
                             f"{time_budget!r}")
    start = time.perf_counter()
    sampler = _Sampler(target, workers, seed, progress)
    try:
        ones = np.zeros(target.domain.size, dtype=np.int64)
        ones[target.allowed_cells()] = 1
        probe = Dataset.from_histogram(ones, target.domain)
        target.prepare(probe, SeededRandom(seed))  # fixes the layout of the output statistics
        settings = dict(runs=runs, screen_runs=screen_runs, max_records=max_records, max_pairs=max_pairs,
                        keep_pairs=keep_pairs, alpha=alpha, seed=seed, workers=sampler.workers)
        if auto:
            settings.update(excess=excess, time_budget=time_budget, search_runs=size)
        plan = _Plan(target, sampler, settings, start, echo)
        if echo is not None or auto:
            plan.announce(probe)
        relation = "move" if target.published_exactly else "add_remove"
        claim = target.claim.group(2) if relation == "move" else target.claim
        report = _audit(plan, relation, claim)
        if relation == "move":
            report.assumed = [f"the published invariants ({', '.join(target.published_exactly)}) are public"]
        count_disclosed = [s for s in report.exact_disclosures if s in target.count_statistics]
        if relation == "add_remove" and count_disclosed:
            report.conditional = _audit(plan, "move", target.claim.group(2))
            report.conditional.assumed = ["the record count is public"]
    finally:
        sampler.close()
    report.seconds = time.perf_counter() - start
    return report


def default_screen_runs(runs: int) -> int:
    """Screening runs per candidate dataset for an audit of ``runs``: ``runs / 20`` within [20, 300]."""
    return int(min(DEFAULT_SCREEN_RUNS, max(20, runs // 20)))


def default_max_pairs(runs: int) -> int:
    """Candidate pairs screened in an audit of ``runs``: ``runs / 400`` within [4, 24]."""
    return int(min(24, max(4, runs // 400)))


class _Plan:
    """The audit's sizes and its clock: how many runs each phase gets, and what they will cost."""

    def __init__(self, target, sampler, settings: dict, start: float, echo) -> None:
        self.target, self.sampler, self.s, self.start, self.echo = target, sampler, settings, start, echo
        self.auto = settings["runs"] == "auto"
        self.search = AUTO_SEARCH_RUNS // 2 if self.auto else settings["runs"] // 2
        self.per_run = None  # wall seconds per run on all workers, measured as the audit goes

    def announce(self, probe) -> None:
        """Time a few runs and say roughly how long the audit takes (a guide on a shared machine).

        In auto mode the screening and the event search are also cut to a third of the time
        budget when they would take longer: the search first (down to :data:`MIN_TEST_RUNS` per
        dataset), then the screening (down to :data:`MIN_SCREEN_RUNS` per dataset). Below that
        floor the audit runs anyway and says it will overrun the budget.
        """
        rng = SeededRandom(2**31 - 1)  # a pilot of the audit's own runs: seeded, never a release
        tick = time.perf_counter()
        for _ in range(PILOT_RUNS):
            self.target.run(probe, rng)
        self.per_run = (time.perf_counter() - tick) / PILOT_RUNS / self.sampler.workers
        s = self.s
        keep = s["keep_pairs"]
        screening = 2 * s["max_pairs"] * s["screen_runs"]
        if self.auto:
            room = s["time_budget"] / 3 / self.per_run  # runs the screening and the search may take
            if screening and room - screening < 2 * keep * MIN_TEST_RUNS:
                fit = int((room - 2 * keep * MIN_TEST_RUNS) / (2 * s["max_pairs"]))
                s["screen_runs"] = min(s["screen_runs"], max(MIN_SCREEN_RUNS, fit))
                screening = 2 * s["max_pairs"] * s["screen_runs"]
            self.search = int(max(MIN_TEST_RUNS, min(self.search, (room - screening) / (2 * keep))))
            s["search_runs"] = 2 * self.search
        if self.echo is None:
            return
        w = self.sampler.workers
        head = f"  about {{:,}} runs at {1e3 * self.per_run * w:.1f} ms each on {w} worker{'s' if w > 1 else ''}"
        if self.auto:
            total = screening + 2 * 2 * keep * self.search  # the sweep costs at most the search's runs
            least = (total + 2 * MIN_TEST_RUNS) * self.per_run
            over = (f"; even with the fewest test runs ({MIN_TEST_RUNS} per dataset) it takes about {_minutes(least)}, "
                    "more than the budget: it runs anyway" if least > s["time_budget"] else "")
            self.echo(head.format(total) + f" before the test ({_minutes(total * self.per_run)}); then the test gets "
                      f"the runs that detect an excess of {s['excess']:g} x epsilon, within "
                      f"{_minutes(s['time_budget'])} in all{over}")
        else:
            total = screening + 2 * 2 * s["keep_pairs"] * self.search + 2 * (s["runs"] - self.search)  # sweep too
            self.echo(head.format(total) + f": roughly {_minutes(total * self.per_run)} (use --runs to trade power "
                      "for time, or --runs auto)")
        sys.stdout.flush()

    def expected_test_runs(self) -> int:
        """The test's runs per dataset the events are chosen for (auto mode: the search's size)."""
        return self.search if self.auto else max(self.s["runs"] - self.search, 1)

    def test_runs(self, best: Candidate, claim: Claim, searched: int, elapsed: float) -> tuple[int, str | None]:
        """Runs per dataset of the test: ``runs - runs // 2``, or in auto mode those of the target
        excess (module notes of :func:`audit`), within the time left."""
        if not self.auto:
            return self.s["runs"] - self.search, None
        per_run = elapsed / max(searched, 1)
        left = self.s["time_budget"] - (time.perf_counter() - self.start)
        affordable = max(int(left / per_run / 2), MIN_TEST_RUNS)
        hi = best.k_a / best.n_a if best.larger == "a" else best.k_b / best.n_b
        target = self.s["excess"] * claim.epsilon
        needed = runs_for_excess(hi, claim.epsilon, target, claim.delta, self.s["alpha"], max_runs=10**7)
        n = affordable if needed is None else max(min(needed, affordable), MIN_TEST_RUNS)
        met = needed is not None and needed <= affordable
        what = (f"test: {n:,} runs per dataset to detect an excess of {target:.3g} over epsilon = {claim.epsilon:.4g} "
                f"with 95% probability (event at P = {hi:.3g}): about {_minutes(2 * n * per_run)}" if met else
                f"test: {n:,} runs per dataset, all the time budget allows (about {_minutes(2 * n * per_run)}); "
                f"detecting an excess of {target:.3g} would need "
                + (f"{needed:,}" if needed is not None else "more than 10^7"))
        if self.echo is not None:
            self.echo(f"  {what}")
            sys.stdout.flush()
        return n, what


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} minutes"


def _audit(plan: _Plan, relation: str, claim: Claim) -> AuditReport:
    target, sampler, s = plan.target, plan.sampler, plan.s
    labels = cell_labels(target.domain)
    hot, hot_why = target.hot_cells()
    allowed = target.allowed_cells()
    if relation == "add_remove":
        pairs = add_remove_pairs(target.domain, s["max_records"], hot, hot_why, allowed)
    else:
        pairs = move_pairs(target.domain, s["max_records"], target.keeps_published, hot, allowed)
        if not pairs:
            raise ParameterError(f"{target.name}: no two datasets of at most {s['max_records']} records differ by "
                                 "one moved record while keeping every published-exact statistic; nothing to audit")
    every = pairs
    pairs, how = limit_pairs(pairs, s["max_pairs"], s["seed"])
    runs_done = Counter()
    ledger = _Ledger()
    screening = []
    disclosures: list[str] = []
    tick = time.perf_counter()
    disclosing = _sweep(plan, every, relation, ledger, runs_done)
    if len(pairs) > s["keep_pairs"] and s["screen_runs"] > 0:
        datasets = list(dict.fromkeys([p.a for p in pairs] + [p.b for p in pairs]))
        results = sampler.sample_many([(h, s["screen_runs"], "screen", relation) for h in datasets])
        samples = {h: ledger.take(r) for h, r in zip(datasets, results)}
        runs_done["screen"] += s["screen_runs"] * len(datasets)
        for p in pairs:  # scored by merit at the search's size: the pair whose evidence the search can confirm
            best = search_events(samples[p.a], samples[p.b], target.names, delta=claim.delta, alpha=s["alpha"],
                                 keep=1, n_test=plan.search)
            screening.append((best[0] if best else None, p))
            disclosures += exact_disclosures(samples[p.a], samples[p.b], target.names)
        screening.sort(key=lambda t: rank(t[0]) if t[0] is not None else (0.0, 1.0, 0.0))
        kept = [p for _, p in screening[: s["keep_pairs"]]]
        screening = [(c.bound if c is not None else 0.0, p) for c, p in screening]
    else:
        kept = pairs[: s["keep_pairs"]]
    if disclosing:  # a pair that discloses exactly goes on first: its event search finds what it shows
        kept = list(dict.fromkeys(disclosing[:1] + kept))[: s["keep_pairs"]]
        how += f"; {len(disclosing)} pair{'s' if len(disclosing) > 1 else ''} of the disclosure sweep disclosed exactly"
    half = plan.search
    results = sampler.sample_many([(h, half, "search", relation) for p in kept for h in (p.a, p.b)])
    best, best_pair, searched = None, None, []
    n_test = plan.expected_test_runs()
    for i, p in enumerate(kept):
        Xa, Xb = ledger.take(results[2 * i]), ledger.take(results[2 * i + 1])
        runs_done["search"] += 2 * half
        disclosures += exact_disclosures(Xa, Xb, target.names)
        found = _propose_and_select(Xa, Xb, target.names, claim, s["alpha"], n_test)
        searched.append((p, found))
        if found and (best is None or _key(found[0]) < _key(best)):
            best, best_pair = found[0], p
    if best is None:
        raise ParameterError(f"{target.name}: the output statistics hold no event to test")
    test, sizing = plan.test_runs(best, claim, sum(runs_done.values()), time.perf_counter() - tick)
    Xa, Xb = (ledger.take(r) for r in sampler.sample_many([(best_pair.a, test, "test", relation),
                                                            (best_pair.b, test, "test", relation)]))
    runs_done["test"] += 2 * test
    ha, hb = best.event.hits(Xa), best.event.hits(Xb)
    k_a, k_b = int(ha.sum()), int(hb.sum())
    hi, lo = (k_a, k_b) if best.larger == "a" else (k_b, k_a)
    bound = float(epsilon_lower_bound(hi, test, lo, test, claim.delta, s["alpha"]))
    p_value = fisher_pvalue(hi, test, lo, test, claim.epsilon, claim.delta)
    excess = detectable_excess(hi / test, test, test, claim.epsilon, claim.delta, s["alpha"])
    return AuditReport(
        target=target.name, title=target.title, claim=claim, relation=relation, pair=best_pair.to_dict(labels),
        pair_text=best_pair.describe(labels), event=best.event, larger=best.larger, k_a=k_a, k_b=k_b, n_a=test,
        n_b=test, epsilon_lower_bound=bound, fisher_p=p_value, alpha=s["alpha"],
        exact_disclosures=list(dict.fromkeys(disclosures)),
        search=[c.describe() for _, found in searched for c in found[:3]],
        screening=[(b, p.describe(labels), p.why) for b, p in screening[:5]], pairs_considered=how,
        runs=dict(runs_done), ledger_runs=ledger.runs, ledger_problems=ledger.problems(),
        published_exactly=list(target.published_exactly), notes=list(getattr(target, "notes", [])),
        settings=dict(s, test_sizing=sizing) if sizing else dict(s), statistic_a=best.event.statistic(Xa),
        statistic_b=best.event.statistic(Xb), detectable_excess=excess)


def _sweep(plan: _Plan, pairs, relation, ledger, runs_done) -> list:
    """The disclosure sweep (module notes): the pairs that disclose exactly on its few runs, in
    covering order. A candidate only: the event search's runs confirm it (a discrete statistic
    can keep one value on a few runs by chance). The record count and whether the run released
    do not count here: a pair of different counts is the screening's, and the count's disclosure
    has its own conditional audit."""
    budget = 2 * plan.s["keep_pairs"] * plan.search  # runs: no more than the event search's
    chosen, datasets = [], {}
    for p in covering_pairs(pairs):
        new = [h for h in (p.a, p.b) if h not in datasets]
        if SWEEP_RUNS * (len(datasets) + len(new)) > budget:
            break
        chosen.append(p)
        datasets.update((h, None) for h in new)
    if len(chosen) <= plan.s["keep_pairs"]:
        return []  # the event search runs these pairs anyway
    keys = list(datasets)
    results = plan.sampler.sample_many([(h, SWEEP_RUNS, "sweep", relation) for h in keys])
    samples = {h: ledger.take(r) for h, r in zip(keys, results)}
    runs_done["sweep"] += SWEEP_RUNS * len(keys)
    count = set(plan.target.count_statistics) | {"released"}  # the record count's: the harness audits those
    found = []                                                   # already (conditionally, when declared public)
    for p in chosen:
        if set(exact_disclosures(samples[p.a], samples[p.b], plan.target.names)) - count:
            found.append(p)
    return found


def _propose_and_select(Xa, Xb, names, claim: Claim, alpha, n_test, keep=16) -> list[Candidate]:
    """Candidates proposed on the first half of the search runs, ranked again on the second half.

    Ranking on runs that did not propose the event removes most of the optimism of picking the
    best of many candidates (an event fitted to chance hits on the first half regresses on the
    second), so the event sent to the test is the one most likely to hold up on fresh runs.
    Both halves rank by merit for a test of ``n_test`` runs per dataset
    (:mod:`dpopt.audit.events`, module notes); the last ties by the excess that test would
    detect (:func:`_key`).
    """
    m = min(Xa.shape[0], Xb.shape[0]) // 2
    proposed = search_events(Xa[:m], Xb[:m], names, delta=claim.delta, alpha=alpha, keep=keep, n_test=n_test)
    ra, rb = Xa[m:], Xb[m:]
    ranked = []
    for c in proposed:
        k_a, k_b = int(c.event.hits(ra).sum()), int(c.event.hits(rb).sum())
        found = scored(c.event, c.larger, k_a, k_b, ra.shape[0], rb.shape[0], n_test, claim.delta, alpha)
        hi, lo = (k_a / ra.shape[0], k_b / rb.shape[0]) if c.larger == "a" else (k_b / rb.shape[0], k_a / ra.shape[0])
        excess = detectable_excess(hi, n_test, n_test, claim.epsilon, claim.delta, alpha) if hi > lo else math.inf
        ranked.append(replace(found, merit=(found.merit[0], -excess, found.merit[2])))
    ranked.sort(key=_key)
    return ranked


def _key(c: Candidate) -> tuple:
    """Sort key of the event search's finalists: the merit at the test's size, then the smaller
    excess the test would detect (none for an event not seen more often on the favoured side),
    then the observed ratio."""
    return rank(c)


class _Ledger:
    """Collects the ledger problems of the runs."""

    def __init__(self) -> None:
        self.runs = 0
        self.counts: Counter = Counter()

    def take(self, result):
        X, problems = result
        self.runs += X.shape[0]
        self.counts.update(problems)
        return X

    def problems(self) -> list[tuple[str, int]]:
        return self.counts.most_common(5)


class _Sampler:
    """Runs a target on datasets in seeded chunks of :data:`CHUNK` runs, over worker processes.

    :meth:`sample_many` sends the chunks of every dataset of a phase to the pool at once, so
    both cores stay busy however many datasets the phase has. A chunk's seed depends on the
    audit's seed, the phase, the dataset and the chunk's number only: the result is the same on
    any number of workers.
    """

    def __init__(self, target: AuditTarget, workers: int | None, seed: int, progress: bool) -> None:
        self.target = target
        self.seed = int(seed)
        cores = os.cpu_count() or 1
        self.workers = max(1, min(int(workers) if workers else cores, cores))
        self.pool = None
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(desc=f"auditing {target.name}", unit="run", file=sys.stderr, leave=False)

    def _pool(self):
        global _TARGET
        if self.pool is None and self.workers > 1 and "fork" in mp.get_all_start_methods():
            _TARGET = self.target
            self.pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("fork"),
                                            initializer=die_with_parent)
        return self.pool

    def sample_many(self, requests) -> list[tuple[np.ndarray, list[str]]]:
        """``[(X, ledger problems)]`` for each ``(hist, n, phase, relation)`` request, in order."""
        jobs, owner = [], []
        for r, (hist, n, phase, relation) in enumerate(requests):
            key = zlib.crc32(np.asarray(hist, dtype=np.int64).tobytes()) ^ zlib.crc32(relation.encode())
            for i, first in enumerate(range(0, n, CHUNK)):
                jobs.append((hist, min(CHUNK, n - first), _chunk_seed(self.seed, phase, key, i)))
                owner.append(r)
        pool = self._pool() if len(jobs) > 1 else None
        results = pool.map(_run_chunk, jobs) if pool is not None else (_run_chunk(j, self.target) for j in jobs)
        rows = [[] for _ in requests]
        problems = [[] for _ in requests]
        for r, (X, probs) in zip(owner, results):
            rows[r].append(X)
            problems[r] += probs
            if self.bar is not None:
                self.bar.update(X.shape[0])
        return [(np.concatenate(x, axis=0), p) for x, p in zip(rows, problems)]

    def close(self) -> None:
        global _TARGET
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
        _TARGET = None
        if self.bar is not None:
            self.bar.close()


def _chunk_seed(seed: int, phase: str, key: int, chunk: int) -> int:
    ss = np.random.SeedSequence(entropy=seed, spawn_key=(_PHASES[phase], key, chunk))
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _run_chunk(job, target: AuditTarget | None = None):
    hist, n, seed = job
    target = target if target is not None else _TARGET
    data = Dataset.from_histogram(np.asarray(hist, dtype=np.int64), target.domain)
    rng = SeededRandom(seed)  # the audit's runs only: reproducible, NOT private
    X = np.empty((n, len(target.names)), dtype=np.float64)
    problems = []
    for i in range(n):
        X[i], problem = target.run(data, rng)
        if problem is not None:
            problems.append(problem)
    return X, problems
