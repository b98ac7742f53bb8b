"""The audit harness: neighbouring datasets, event search, then a one-sided test on fresh runs.

:func:`audit` runs three phases on an :class:`~dpopt.audit.targets.AuditTarget`, each on runs of
its own (a run's seed is derived from the phase, the dataset and the chunk, so an audit is
reproducible and the phases never share a run):

1. **screening** (worst-case search over pairs): every distinct dataset of the candidate pairs
   (:mod:`dpopt.audit.neighbours`) is run ``screen_runs`` times and each pair is scored by the
   best event found on its runs; the ``keep_pairs`` best pairs go on;
2. **event search** (StatDP's event selection, Ding et al. CCS 2018): half of ``runs`` on each
   dataset of each kept pair; candidate events are proposed on the first half of these runs
   (:func:`dpopt.audit.events.search_events`) and ranked again on the second half, and the most
   telling (pair, event) is chosen;
3. **test**: the other half of ``runs``, fresh, on the chosen pair: a Clopper–Pearson lower
   bound on ε (δ-thinned when δ > 0) and Fisher's exact test at the claimed ε as a second
   opinion (:mod:`dpopt.audit.stats`). One test, so its confidence needs no correction for the
   search: the search only chose *which* test to run.

Every run's ledger is checked (:func:`dpopt.audit.targets.ledger_problem`). A statistic that
takes one value on every run of one dataset and another on every run of its neighbour is an
*exact disclosure*; when it is the record count, the audit continues conditional on it (the
``move`` relation, against the group guarantee) and reports both.

Runs are spread over worker processes (``workers``; forked, so the target is not pickled).
Randomness: each chunk of runs draws from a :class:`~dpopt.privacy.randomness.SeededRandom`
(reproducible and NOT private) -- acceptable here and only here, because an audit publishes
statistics of synthetic datasets, never a release.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from dpopt.audit.claims import Claim
from dpopt.audit.defaults import DEFAULT_RUNS
from dpopt.audit.events import Candidate, exact_disclosures, rank, search_events
from dpopt.audit.neighbours import add_remove_pairs, cell_labels, limit_pairs, move_pairs
from dpopt.audit.report import AuditReport
from dpopt.audit.stats import epsilon_lower_bound, fisher_pvalue
from dpopt.audit.targets import AuditTarget
from dpopt.errors import ParameterError
from dpopt.model.data import Dataset
from dpopt.privacy.randomness import SeededRandom
from dpopt.workers import die_with_parent

__all__ = ["audit", "default_screen_runs", "default_max_pairs", "DEFAULT_RUNS", "DEFAULT_SCREEN_RUNS"]

#: Runs of each candidate dataset in the screening of pairs.
DEFAULT_SCREEN_RUNS = 300
#: Runs per work item (a chunk shares one seeded source).
CHUNK = 250
_PHASES = {"probe": 0, "screen": 1, "search": 2, "test": 3}

_TARGET: AuditTarget | None = None  # the target of the running audit, inherited by forked workers


def audit(target: AuditTarget, *, runs: int = DEFAULT_RUNS, screen_runs: int | None = None,
          max_records: int = 2, max_pairs: int | None = None, keep_pairs: int = 2, alpha: float = 0.05,
          workers: int | None = 1, seed: int = 0, progress: bool = False) -> AuditReport:
    """Audit ``target`` (module notes) and return an :class:`~dpopt.audit.report.AuditReport`.

    Parameters
    ----------
    target : AuditTarget
        E.g. :class:`~dpopt.audit.targets.AlgorithmTarget` or a mechanism of
        :mod:`dpopt.audit.mechanisms`.
    runs : int
        Runs of each of the two datasets of the chosen pair (half search, half test).
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
    """
    if screen_runs is None:
        screen_runs = default_screen_runs(runs)
    if max_pairs is None:
        max_pairs = default_max_pairs(runs)
    for name, value, low in (("runs", runs, 4), ("screen_runs", screen_runs, 0), ("max_records", max_records, 1),
                             ("max_pairs", max_pairs, 1), ("keep_pairs", keep_pairs, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ParameterError(f"audit: {name} must be an integer >= {low}, got {value!r}")
    if not 0 < alpha < 1:
        raise ParameterError(f"audit: alpha must lie in (0, 1), got {alpha!r}")
    start = time.perf_counter()
    sampler = _Sampler(target, workers, seed, progress)
    try:
        ones = np.zeros(target.domain.size, dtype=np.int64)
        ones[target.allowed_cells()] = 1
        probe = Dataset.from_histogram(ones, target.domain)
        target.prepare(probe, SeededRandom(seed))  # fixes the layout of the output statistics
        settings = dict(runs=runs, screen_runs=screen_runs, max_records=max_records, max_pairs=max_pairs,
                        keep_pairs=keep_pairs, alpha=alpha, seed=seed, workers=sampler.workers)
        relation = "move" if target.published_exactly else "add_remove"
        claim = target.claim.group(2) if relation == "move" else target.claim
        report = _audit(target, sampler, relation, claim, settings)
        count_disclosed = [s for s in report.exact_disclosures if s in target.count_statistics]
        if relation == "add_remove" and count_disclosed:
            report.conditional = _audit(target, sampler, "move", target.claim.group(2), settings)
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


def _audit(target: AuditTarget, sampler: "_Sampler", relation: str, claim: Claim, s: dict) -> AuditReport:
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
    pairs, how = limit_pairs(pairs, s["max_pairs"], s["seed"])
    runs_done = Counter()
    ledger = _Ledger()
    screening = []
    disclosures: list[str] = []
    if len(pairs) > s["keep_pairs"] and s["screen_runs"] > 0:
        datasets = list(dict.fromkeys([p.a for p in pairs] + [p.b for p in pairs]))
        samples = {}
        for h in datasets:
            samples[h] = ledger.take(sampler.sample(h, s["screen_runs"], "screen", relation))
            runs_done["screen"] += s["screen_runs"]
        for p in pairs:
            best = search_events(samples[p.a], samples[p.b], target.names, delta=claim.delta, alpha=s["alpha"],
                                 keep=1, score=False)
            screening.append((best[0].bound if best else 0.0, p))
            disclosures += exact_disclosures(samples[p.a], samples[p.b], target.names)
        screening.sort(key=lambda t: -t[0])
        kept = [p for _, p in screening[: s["keep_pairs"]]]
    else:
        kept = pairs[: s["keep_pairs"]]
    half = s["runs"] // 2
    best, best_pair, searched = None, None, []
    for p in kept:
        Xa = ledger.take(sampler.sample(p.a, half, "search", relation))
        Xb = ledger.take(sampler.sample(p.b, half, "search", relation))
        runs_done["search"] += 2 * half
        disclosures += exact_disclosures(Xa, Xb, target.names)
        found = _propose_and_select(Xa, Xb, target.names, claim.delta, s["alpha"])
        searched.append((p, found))
        if found and (best is None or found[0].bound > best.bound):
            best, best_pair = found[0], p
    if best is None:
        raise ParameterError(f"{target.name}: the output statistics hold no event to test")
    test = s["runs"] - half
    Xa = ledger.take(sampler.sample(best_pair.a, test, "test", relation))
    Xb = ledger.take(sampler.sample(best_pair.b, test, "test", relation))
    runs_done["test"] += 2 * test
    ha, hb = best.event.hits(Xa), best.event.hits(Xb)
    k_a, k_b = int(ha.sum()), int(hb.sum())
    hi, lo = (k_a, k_b) if best.larger == "a" else (k_b, k_a)
    bound = float(epsilon_lower_bound(hi, test, lo, test, claim.delta, s["alpha"]))
    p_value = fisher_pvalue(hi, test, lo, test, claim.epsilon, claim.delta)
    return AuditReport(
        target=target.name, title=target.title, claim=claim, relation=relation, pair=best_pair.to_dict(labels),
        pair_text=best_pair.describe(labels), event=best.event, larger=best.larger, k_a=k_a, k_b=k_b, n_a=test,
        n_b=test, epsilon_lower_bound=bound, fisher_p=p_value, alpha=s["alpha"],
        exact_disclosures=list(dict.fromkeys(disclosures)),
        search=[c.describe() for _, found in searched for c in found[:3]],
        screening=[(b, p.describe(labels), p.why) for b, p in screening[:5]], pairs_considered=how,
        runs=dict(runs_done), ledger_runs=ledger.runs, ledger_problems=ledger.problems(),
        published_exactly=list(target.published_exactly), notes=list(getattr(target, "notes", [])),
        settings=dict(s), statistic_a=best.event.statistic(Xa), statistic_b=best.event.statistic(Xb))


def _propose_and_select(Xa, Xb, names, delta, alpha, keep=16) -> list[Candidate]:
    """Candidates proposed on the first half of the search runs, ranked again on the second half.

    Ranking on runs that did not propose the event removes most of the optimism of picking the
    best of many candidates (an event fitted to chance hits on the first half regresses on the
    second), so the event sent to the test is the one most likely to hold up on fresh runs.
    """
    m = min(Xa.shape[0], Xb.shape[0]) // 2
    proposed = search_events(Xa[:m], Xb[:m], names, delta=delta, alpha=alpha, keep=keep)
    ra, rb = Xa[m:], Xb[m:]
    ranked = []
    for c in proposed:
        k_a, k_b = int(c.event.hits(ra).sum()), int(c.event.hits(rb).sum())
        hi, lo = (k_a, k_b) if c.larger == "a" else (k_b, k_a)
        bound = float(epsilon_lower_bound(hi, ra.shape[0], lo, rb.shape[0], delta, alpha))
        ranked.append(Candidate(c.event, c.larger, k_a, k_b, ra.shape[0], rb.shape[0], bound))
    ranked.sort(key=rank)  # ties (all 0): the largest observed ratio
    return ranked


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
    """Runs a target on a dataset ``n`` times, in seeded chunks, over worker processes."""

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

    def sample(self, hist: tuple, n: int, phase: str, relation: str) -> tuple[np.ndarray, list[str]]:
        key = zlib.crc32(np.asarray(hist, dtype=np.int64).tobytes()) ^ zlib.crc32(relation.encode())
        jobs = [(hist, min(CHUNK, n - start), _chunk_seed(self.seed, phase, key, i))
                for i, start in enumerate(range(0, n, CHUNK))]
        pool = self._pool() if len(jobs) > 1 else None
        results = pool.map(_run_chunk, jobs) if pool is not None else (_run_chunk(j, self.target) for j in jobs)
        rows, problems = [], []
        for X, probs in results:
            rows.append(X)
            problems += probs
            if self.bar is not None:
                self.bar.update(X.shape[0])
        return np.concatenate(rows, axis=0), problems

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
