"""Marginal-space estimation on wide data (issue 27): error, time and memory against the number of attributes.

Cases (``--cases``):

* ``nltcs``  — 16 binary attributes, every 3-way marginal measured (560). Methods on the *same*
  measurements: the marginal-space estimate (``space``: the domain fits, so it is solved as a
  table), its local relaxation (``space-local``, ``exact_cells = 0``), the dense pipeline
  (``dpopt.estimate.reconstruct``, L2 with non-negativity) and Private-PGM (``pgm``,
  ``mbi.estimation.MirrorDescent``, when ``pip install mbi`` is done).
* ``adult-3way`` (alias ``adult``) — UCI Adult as discretised for Private-PGM (14 attributes,
  6.4·10^17 cells), every 3-way marginal measured (364, 20.9 million cells): ``space`` (with CPU
  seconds, the certified gap and why the solve stopped) and, with ``--pgm``, Private-PGM run in a
  child process whose outcome is recorded (its junction tree of all triples is the whole domain);
  ``adult-chain`` a chain of 3-way marginals (attributes i, i+1, i+2:
  decomposable) where Private-PGM finishes, on the same measurements. ``--estimators`` picks the
  estimator options run on those measurements: ``auto`` (default: the estimator's defaults, the
  objective rule of ``choose_objective`` — smooth on a small junction tree, else least squares —
  and ``total="auto"``, then records on the chain), ``ls`` (``objective="l2"``: least squares
  with non-negativity), ``free`` (least squares with ``total="free"``: the total left to the
  non-negative fit, the default before the total rule),
  ``shrink`` (``shrink=True``), ``unconstrained`` (``nonnegative=False``: the consistent
  least-squares fit) and ``total-hat`` (``total="measured"``: the total held at the unconstrained
  fit's, whatever the rule says), ``smooth`` (``objective="smooth"``: the entropy-regularised
  estimate on a junction tree, :mod:`dpopt.estimate.marginal_space.graphical.smooth`) and ``smooth-1way``
  (the same from the product of the estimated one-way marginals). Each row gives the estimate's
  total and whether it was held. With ``bn`` the options other than ``ls`` run on ``auto``'s
  selected measurements (``auto wide, ...`` rows); with ``nltcs`` beside the dense smooth engine.
  The rule's validation away from adult is ``bench_wide_total.py``.
* ``adult-auto`` — what a user who names *every* 3-way marginal of adult gets by default:
  ``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`: the one-way marginals, the probe,
  then every triple or about d selected marginals; the fit by ``choose_objective``), measurement,
  selection and estimate timed together, the error per triple (``error``, all 364) and on the
  chain's 12 triples (``error_subset``, to set beside the ``adult-chain`` rows), its records, and
  with ``--pgm`` Private-PGM on the *same selected measurements* (one-way marginals included).
  Rows give the mode, whether "all" was open (``all_fits``), the chosen sets and the certificate.
* ``adult-slice`` — every triple of the attributes ``--attrs`` measured (zCDP or pure, equal
  shares), then the estimator options of ``--estimators`` (``ls`` for least squares) with
  ``--time-limit``: the solve evidence behind ``wide_selection.ALL_L2_CELLS`` (clique cells,
  CPU seconds, certificate).
* ``bn``     — binary data from a known sparse Bayesian network (``dpopt.datasets.bayes_net``,
  parents within 3 places, seed 1), n = 50,000, d = 27, 50, 100: every 2-way marginal (and every
  3-way at d = 27). ``space`` measures the workload; ``space (shrink)`` is the same estimate
  with ``shrink=True`` (empirical-Bayes shrinkage towards independence); ``auto wide`` is ``auto``'s
  plan on wide data (:mod:`dpopt.strategy.wide_selection`: one-way marginals, then every workload
  marginal, or a second one-way measurement by the module's rule and d marginals (2d for pairs
  where the module's *Rounds for pairs* says they pay) chosen by the
  exponential mechanism, same budget; its time covers measurement, selection and estimation; the
  rule's validation on other networks is ``bench_wide_rule.py``) and ``auto wide records`` its synthetic records;
  ``mwem`` is factored MWEM at its documented defaults (rounds by the rule, block selection,
  5 group passes, 10 final passes) on the same budget; ``independent`` is the product of the
  *exact* 1-way marginals (not private, a baseline); ``records`` the marginals of the synthetic
  records drawn from the estimate.
  Errors against the data's marginals and against the network's exact (population) marginals.

Budgets: ``--eps`` (default 0.1 and 1). Under ``pure`` the marginals get discrete Laplace noise
(each marginal eps/M); under ``zcdp`` discrete Gaussian with ``rho = eps^2 / 2`` (the zCDP of a
pure eps mechanism; it is NOT pure eps-DP), each marginal rho/M — both calibrated and drawn by
dpopt's own mechanisms from a seeded source (a benchmark, not a release). Factored MWEM runs under
the same accounting and budget.

Error: the mean over the workload marginals of ``||estimate - truth||_1 / n``. Time: wall seconds
of the estimation alone (measurement excluded); memory: peak resident MB of the process that ran
the case (each case runs in its own process). Timings on a loaded machine: see the closing note.

Run::

    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide.py --cases bn --eps 1
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide.py --cases nltcs adult --pgm
    python examples/benchmarks/bench_wide.py --cases bn --eps 1 --plot wide.png   # error and time against d
    python examples/benchmarks/bench_wide.py --cases bn --eps 1 --no-mwem          # without MWEM's minutes
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide.py --cases adult-chain \
        --accounting zcdp --eps 0.1 1 --estimators ls free shrink unconstrained total-hat  # options, same measurements
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide.py --cases adult-auto --pgm \
        --accounting zcdp pure --eps 0.1 1                        # auto's default plan on all triples, and PGM
    OPENBLAS_NUM_THREADS=1 nice -n 10 python examples/benchmarks/bench_wide.py --cases adult-slice --eps 1 \
        --accounting zcdp --estimators ls --time-limit 3000 --attrs age marital-status occupation race \
        capital-loss hours-per-week 'income>50K' sex              # least squares on 56 triples, 1.77 M cells
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from fractions import Fraction
from itertools import combinations
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_adult_pgm, load_binary, peak_memory_mb, shared_file  # noqa: E402

BN_SIZES = (27, 50, 100)
COLORS = {"space": "tab:blue", "auto wide": "tab:green", "mwem": "tab:orange", "independent (exact 1-way)": "tab:gray"}
RECORDS = 50_000
#: The adult cases' estimator options (``--estimators``): label and keyword arguments of estimate_marginals.
ESTIMATORS = {"ls": ("space (least squares)", {"objective": "l2"}), "auto": ("space", {}),
              "free": ("space (total free)", {"objective": "l2", "total": "free"}),
              "shrink": ("space (shrink)", {"shrink": True}),
              "unconstrained": ("space (no non-negativity)", {"nonnegative": False}),
              "total-hat": ("space (total = n̂, held)", {"objective": "l2", "total": "measured"}),
              "smooth": ("space (smooth)", {"objective": "smooth"}),
              "smooth-1way": ("space (smooth, one-way prior)", {"objective": "smooth", "smooth": {"prior": "one-way"}})}


# ---- measurements ---------------------------------------------------------------------------------
def measure_sets(data, sets, accounting: str, eps: float, seed: int):
    """Every marginal of ``sets`` measured with an equal share of the budget (dpopt's calibration
    and exact samplers, seeded)."""
    from dpopt.algorithms.measure_reconstruct import plan_measures
    from dpopt.model.queries.marginal import Marginal
    from dpopt.privacy.mechanisms import measure
    from dpopt.privacy.randomness import make_random
    from dpopt.spec.model import MeasureSpec

    budget = budget_of(accounting, eps)
    share = Fraction(1, len(sets))
    specs = [MeasureSpec(", ".join(s), Marginal(data.domain, s), None, share) for s in sets]
    planned = plan_measures(specs, data.domain, budget)
    accountant, rng = budget.accountant(), make_random(seed)
    return [measure(m.query, data, m.law, accountant, rng, label=m.label) for m in planned], budget


def budget_of(accounting: str, eps: float):
    """The benchmark's budget: pure ``eps``, or zCDP ``rho = eps^2 / 2``."""
    from dpopt.privacy.budget import Budget

    return Budget.pure(Fraction(eps).limit_denominator(10**6)) if accounting == "pure" else \
        Budget.zcdp(Fraction(eps * eps / 2).limit_denominator(10**6))


def errors(estimates: dict, truths: dict, n: float) -> float:
    return float(np.mean([np.abs(np.asarray(estimates[s], float) - truths[s]).sum() / n for s in truths]))


# ---- the cases ------------------------------------------------------------------------------------------
def case_rows(case: str, eps: float, accounting: str, seed: int, pgm: bool, time_limit: float | None,
              mwem: bool = True, estimators=("auto",), attrs=None) -> list[dict]:
    if case == "nltcs":
        return nltcs_rows(eps, accounting, seed, pgm, estimators)
    if case == "adult-auto":
        return adult_auto_rows(eps, accounting, seed, pgm, time_limit, estimators)
    if case.startswith("adult"):
        return adult_rows(case, eps, accounting, seed, pgm, time_limit, estimators, attrs)
    return bn_rows(int(case[2:].split("k")[0]), int(case.split("k")[1]), eps, accounting, seed, time_limit, mwem,
                   estimators)


def space_row(label, ms, workload, truths, n, time_limit=None, **options) -> tuple[dict, object]:
    from dpopt.estimate.marginal_space import estimate_marginals

    tick, cpu = time.perf_counter(), time.process_time()
    est = estimate_marginals(ms, workload, time_limit=time_limit, **options)
    seconds = time.perf_counter() - tick
    row = {"method": label, "seconds": seconds, "status": est.status.name, "polytope": est.info["polytope"],
           "cells": est.info["clique_cells"], "total": est.total, "total_held": est.info["total"]["held"],
           "objective": est.info["objective"]["objective"], "cpu_seconds": time.process_time() - cpu}
    if est.success:
        row["error"] = errors(est.marginals([tuple(s) for s in truths]), truths, n)
    return row, est


def nltcs_rows(eps, accounting, seed, pgm, estimators=("auto",)) -> list[dict]:
    from dpopt.estimate import reconstruct
    from dpopt.model.constraints import ConstraintSet, NonNegativity
    from dpopt.model.queries.marginal import Marginal

    data = load_binary("nltcs")
    sets = list(combinations(data.domain.attrs, 3))
    ms, _ = measure_sets(data, sets, accounting, eps, seed)
    truths = {s: data.marginal(s).astype(float) for s in sets}
    n = float(data.total)
    rows = [space_row("space", ms, sets, truths, n)[0], space_row("space-local", ms, sets, truths, n, exact_cells=0)[0]]
    tick = time.perf_counter()
    dense = reconstruct(ms, ConstraintSet(data.domain, [NonNegativity()]), "l2")
    rows.append({"method": "dense", "seconds": time.perf_counter() - tick, "status": dense.status.name,
                 "error": errors({s: Marginal(data.domain, s).matvec(dense.x) for s in sets}, truths, n)})
    for name in estimators:  # other options of the marginal-space estimate, on the same measurements
        if name == "auto":  # the "space" row above
            continue
        cpu = time.process_time()
        row, _ = space_row(ESTIMATORS[name][0], ms, sets, truths, n, **ESTIMATORS[name][1])
        rows.append({**row, "cpu_seconds": time.process_time() - cpu})
    if "smooth" in estimators:  # the dense smooth engine, which the marginal-space one equals
        tick, cpu = time.perf_counter(), time.process_time()
        dense = reconstruct(ms, ConstraintSet(data.domain, [NonNegativity()]), "smooth")
        rows.append({"method": "dense smooth", "seconds": time.perf_counter() - tick,
                     "cpu_seconds": time.process_time() - cpu, "status": dense.status.name,
                     "error": errors({s: Marginal(data.domain, s).matvec(dense.x) for s in sets}, truths, n)})
    if pgm:
        rows.append(pgm_row(data, ms, sets, truths, n))
    return rows


def adult_rows(case, eps, accounting, seed, pgm, time_limit, estimators=("auto",), attrs=None) -> list[dict]:
    """``adult-chain`` (12 triples i, i+1, i+2) or ``adult``/``adult-3way`` (all 364 triples): the
    estimate (error per workload marginal, CPU seconds, certificate), its records on the chain,
    and Private-PGM on the same measurements when ``pgm`` (on all triples its outcome is recorded,
    whatever it is: it runs in a child process so that running out of memory ends only it).
    ``adult-slice``: every triple of the attributes ``attrs`` (``--attrs``), the solve evidence of
    :data:`dpopt.strategy.wide_selection.ALL_L2_CELLS`."""
    from dpopt.estimate.marginal_space.layout import clique_cells

    data = load_adult_pgm() if case != "adult-slice" else load_adult_slice(attrs)
    attrs = data.domain.attrs
    if case == "adult-chain":
        sets = [tuple(attrs[i:i + 3]) for i in range(len(attrs) - 2)]
    else:
        sets = list(combinations(attrs, 3))
    ms, _ = measure_sets(data, sets, accounting, eps, seed)
    truths = {s: data.marginal(s).astype(float) for s in sets}
    n = float(data.total)
    rows = []
    for name in estimators:
        cpu = time.process_time()
        options = dict(ESTIMATORS[name][1])
        row, est = space_row(ESTIMATORS[name][0], ms, sets, truths, n, time_limit=time_limit, **options)
        cert = est.info.get("certificate", {})
        row.update(cpu_seconds=time.process_time() - cpu, gap=cert.get("gap"), stopped=est.info.get("stopped"),
                   triples=len(sets), clique_cells_all=clique_cells(data.domain, sets),
                   iterations=est.nit, history=[(int(h[1]), float(h[2])) for h in est.info.get("history", [])[-12:]])
        if not est.success:  # the solver's incumbent, labelled as such: not an estimate dpopt would release
            row["incumbent_error"] = errors(est.marginals(sets), truths, n)
        print(json.dumps({"eps": eps, **row}, default=str), file=sys.stderr, flush=True)  # progress, case by case
        rows.append(row)
        if name == "auto" and est.success and case == "adult-chain":  # records of all 364 triples: not benchmarked
            rows.append(records_row(est, data, sets, truths, n))
    if pgm and case == "adult-chain":
        rows.append(pgm_row(data, ms, sets, truths, n))
    elif pgm:
        rows.append(pgm_child(case, eps, accounting, seed))
    return rows


def adult_auto_rows(eps, accounting, seed, pgm, time_limit, estimators=("auto",)) -> list[dict]:
    """``adult-auto``: what a user who names every 3-way marginal of adult gets from ``auto``'s wide
    plan (:mod:`dpopt.strategy.wide_selection`: one-way marginals, the probe, then every triple or
    about d selected marginals, the fit by ``choose_objective``), error per workload triple, and
    Private-PGM on the same selected measurements; ``error_subset`` is the error on the chain's 12
    triples (i, i+1, i+2), comparable with the ``adult-chain`` rows (which measure only those)."""
    data = load_adult_pgm()
    attrs = data.domain.attrs
    sets = list(combinations(attrs, 3))
    truths = {s: data.marginal(s).astype(float) for s in sets}
    chain = {s: truths[s] for s in (tuple(attrs[i:i + 3]) for i in range(len(attrs) - 2))}
    n = float(data.total)
    rows = selected_rows(data, sets, budget_of(accounting, eps), seed, truths, None, n, time_limit, estimators,
                         pgm=pgm, subset=chain)
    # Baselines, not private: the product of the exact one-way marginals, and the uniform table.
    one = {a: data.marginal([a]) / n for a in attrs}
    independent = {s: n * np.einsum("i,j,k->ijk", *(one[a] for a in s)).ravel() for s in sets}
    uniform = {s: np.full(truths[s].size, n / truths[s].size) for s in sets}
    for label, fitted in (("independent (exact 1-way)", independent), ("uniform", uniform)):
        rows.append({"method": label, "error": errors(fitted, truths, n),
                     "error_subset": errors({s: fitted[s] for s in chain}, chain, n)})
    return rows


def load_adult_slice(attrs):
    """adult_pgm on the attributes ``attrs`` only (in that order)."""
    import pandas as pd

    from dpopt.model.data import Dataset
    from dpopt.model.domain import Domain

    sizes = json.loads(shared_file("adult_pgm_domain.json").read_text())
    frame = pd.read_csv(shared_file("adult_pgm.csv"), usecols=list(attrs))[list(attrs)]
    return Dataset.from_frame(frame, Domain(tuple(attrs), tuple(int(sizes[a]) for a in attrs)))


def pgm_child(case, eps, accounting, seed) -> dict:
    """Private-PGM in a child process (``--pgm-only``): its row, or how it ended (signal, memory)."""
    cmd = [sys.executable, __file__, "--pgm-only", case, "--eps", str(eps), "--accounting", accounting,
           "--seed", str(seed)]
    tick = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - tick
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (out.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
    return {"method": "pgm (1000 iterations)", "seconds": seconds,
            "status": f"failed (exit {out.returncode}): {tail}"}


def run_pgm_only(args) -> None:
    data = load_adult_pgm()
    sets = list(combinations(data.domain.attrs, 3))
    ms, _ = measure_sets(data, sets, args.accounting[0], args.eps[0], args.seed)
    truths = {s: data.marginal(s).astype(float) for s in sets}
    row = pgm_row(data, ms, sets, truths, float(data.total))
    row["peak_mb"] = peak_memory_mb()
    print(json.dumps(row))


def selected_rows(data, sets, budget, seed, truths, population, n, time_limit, estimators=("auto",), *,
                  pgm: bool = False, subset: dict | None = None) -> list[dict]:
    """``auto``'s wide plan (:mod:`dpopt.strategy.wide_selection`): one-way marginals, the probe, then
    every workload marginal or the exponentially-chosen ones; measurement, selection and
    estimation timed together (CPU seconds beside wall), then its records. ``population``: the
    network's marginals (``None`` on real data); ``pgm``: Private-PGM on the same selected
    measurements; ``subset``: truths of some workload sets, whose mean error is also reported
    (``error_subset``: on adult, the chain's 12 triples, to compare with the ``adult-chain`` rows)."""
    from dpopt.privacy.randomness import make_random
    from dpopt.strategy.wide_selection import plan_wide_selection, run_wide_selection

    tick, cpu = time.perf_counter(), time.process_time()
    plan = plan_wide_selection(data.domain, sets, budget, budget.noise(None))
    chosen = run_wide_selection(plan, data, budget.accountant(), make_random(seed))
    measured = len(chosen.chosen) if chosen.mode == "select" else len(sets) if chosen.mode == "all" else 0
    row, est = space_row(f"auto wide ({chosen.mode}, {measured} workload-sized measured)",
                         chosen.measurements, sets, truths, n, time_limit=time_limit)
    row["seconds"], row["cpu_seconds"] = time.perf_counter() - tick, time.process_time() - cpu
    fits = getattr(plan, "all_fit", None)
    row.update(mode=chosen.mode, all_fits=None if fits is None else fits.fits,
               gap=est.info.get("certificate", {}).get("gap"), chosen=chosen.info()["chosen"],
               one_way_measurements=len(chosen.measurements) - measured, steer=chosen.steer,
               top_up=str(chosen.top_up), refused=len(chosen.refused))
    rows = [row]
    if est.success:
        if population is not None:
            row["error_vs_network"] = errors(est.marginals(sets), population, n)
        if subset:
            row["error_subset"] = errors(est.marginals(list(subset)), subset, n)
        records = records_row(est, data, sets, truths, n, population)
        records["method"] = "auto wide records"
        rows.append(records)
    print(json.dumps(rows, default=str), file=sys.stderr, flush=True)  # progress, before Private-PGM's minutes
    if pgm:  # Private-PGM on the same selected measurements (one-way marginals included)
        row = pgm_row(data, chosen.measurements, sets, truths, n, subset=subset)
        rows.append(row)
    for name in estimators:  # other estimator options on the same selected measurements
        if name == "auto":  # the first row
            continue
        cpu = time.process_time()
        row, est = space_row(f"auto wide, {ESTIMATORS[name][0]}", chosen.measurements, sets, truths, n,
                             time_limit=time_limit, **ESTIMATORS[name][1])
        row.update(cpu_seconds=time.process_time() - cpu, gap=est.info.get("certificate", {}).get("gap"),
                   largest_clique_cells=est.info.get("largest_clique_cells"))
        if est.success and population is not None:
            row["error_vs_network"] = errors(est.marginals(sets), population, n)
        rows.append(row)
    return rows


def bn_rows(d, k, eps, accounting, seed, time_limit, mwem=True, estimators=("auto",)) -> list[dict]:
    from dpopt.algorithms.mwem_factored import factored_mwem
    from dpopt.datasets.bayes_net import random_sparse_network
    from dpopt.estimate.engines.factored import BinaryMarginalCells
    from dpopt.privacy.randomness import make_random

    net = random_sparse_network(d, seed=1)
    data = net.sample(RECORDS, 2)
    combos, exact = net.marginals(k)
    names = data.domain.attrs
    sets = [tuple(names[a] for a in c) for c in combos]
    counts = data.binary_marginal_counts(k)
    truths = {s: counts[i].astype(float) for i, s in enumerate(sets)}
    population = {s: exact[i] * RECORDS for i, s in enumerate(sets)}
    n = float(data.total)
    ms, budget = measure_sets(data, sets, accounting, eps, seed)
    rows = []
    row, est = space_row("space", ms, sets, truths, n, time_limit=time_limit)
    if est.success:
        row["error_vs_network"] = errors(est.marginals(sets), population, n)
    rows.append(row)
    if est.success:
        rows.append(records_row(est, data, sets, truths, n, population))
    row, est = space_row("space (shrink)", ms, sets, truths, n, time_limit=time_limit, shrink=True)
    if est.success:
        row["error_vs_network"] = errors(est.marginals(sets), population, n)
    rows.append(row)
    rows.extend(selected_rows(data, sets, budget, seed, truths, population, n, time_limit, estimators))
    if mwem:
        tick = time.perf_counter()
        amount = {"epsilon": eps} if accounting == "pure" else {"rho": eps * eps / 2}
        res = factored_mwem(data, k, rng=make_random(seed + 1), **amount)
        cells = BinaryMarginalCells(res.table, k).cells * n
        fitted = {s: cells[i] for i, s in enumerate(sets)}
        rows.append({"method": f"mwem (T={res.rounds})", "seconds": time.perf_counter() - tick,
                     "status": "COMPLETED", "error": errors(fitted, truths, n),
                     "error_vs_network": errors(fitted, population, n)})
    one = data.binary_marginal_counts(1)[:, 1] / n
    independent = {}
    for s, c in zip(sets, combos):
        p = np.ones(1)
        for a in c:
            p = np.multiply.outer(p, [1 - one[a], one[a]]).ravel()
        independent[s] = p * n
    rows.append({"method": "independent (exact 1-way)", "error": errors(independent, truths, n),
                 "error_vs_network": errors(independent, population, n)})
    rows.append({"method": "data vs network", "error": errors(truths, population, n)})
    return rows


def records_row(est, data, sets, truths, n, population=None) -> dict:
    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import make_random

    tick = time.perf_counter()
    codes = est.records(rng=make_random(99))
    seconds = time.perf_counter() - tick
    records = Dataset(codes, data.domain)
    scale = n / max(len(codes), 1)
    fitted = {s: records.marginal(s) * scale for s in sets}
    row = {"method": "records", "seconds": seconds, "status": f"{len(codes):,} records",
           "error": errors(fitted, truths, n)}
    if population is not None:
        row["error_vs_network"] = errors(fitted, population, n)
    return row


def pgm_row(data, ms, sets, truths, n, iters: int = 1000, subset: dict | None = None) -> dict:
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_enable_compilation_cache", False)
        import mbi
        from mbi.estimation import MirrorDescent
    except ImportError:
        return {"method": "pgm", "status": "not installed (pip install mbi)"}
    attrs = list(data.domain.attrs)
    domain = mbi.Domain(attrs, list(data.domain.shape))
    measured = [mbi.LinearMeasurement(np.asarray(m.values, dtype=float), tuple(m.query.attrs), stddev=float(m.stddev))
                for m in ms]
    tick, cpu = time.perf_counter(), time.process_time()
    model = MirrorDescent().estimate(domain, measured, iters=iters)
    fitted = {s: np.asarray(model.project(tuple(s)).datavector(), float).ravel() for s in sets}
    row = {"method": f"pgm ({iters} iterations)", "seconds": time.perf_counter() - tick, "status": "done",
           "cpu_seconds": time.process_time() - cpu, "error": errors(fitted, truths, n)}
    if subset:
        row["error_subset"] = errors(fitted, subset, n)
    return row


# ---- driver -----------------------------------------------------------------------------------------------
def run_one(args) -> None:
    rows = case_rows(args.one, args.eps[0], args.accounting[0], args.seed, args.pgm, args.time_limit,
                     not args.no_mwem, args.estimators, args.attrs)
    print(json.dumps({"rows": rows, "peak_mb": peak_memory_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["bn"],
                        choices=["nltcs", "adult", "adult-3way", "adult-chain", "adult-auto", "adult-slice", "bn"])
    parser.add_argument("--attrs", nargs="+", default=None, help="adult-slice: the attributes (every triple measured)")
    parser.add_argument("--eps", nargs="+", type=float, default=[0.1, 1.0])
    parser.add_argument("--accounting", nargs="+", default=["zcdp", "pure"], choices=["zcdp", "pure"])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(BN_SIZES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pgm", action="store_true", help="also Private-PGM (pip install mbi)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for each estimation")
    parser.add_argument("--no-mwem", action="store_true", help="bn: skip factored MWEM (minutes per case)")
    parser.add_argument("--plot", type=Path, default=None, help="write error and time against d to this PNG")
    parser.add_argument("--estimators", nargs="+", default=["auto"], choices=list(ESTIMATORS),
                        help="the estimator options to run on the same measurements (default auto; adult and "
                             "nltcs: on the measured sets, bn: on auto's selected measurements)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--pgm-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pgm_only:
        run_pgm_only(args)
        return
    if args.one:
        run_one(args)
        return
    cases = []
    for case in args.cases:
        if case == "bn":
            cases += [f"bn{d}k2" for d in args.sizes] + (["bn27k3"] if 27 in args.sizes else [])
        else:
            cases.append(case)
    results = []
    for case in cases:
        for accounting in args.accounting:
            for eps in args.eps:
                cmd = [sys.executable, __file__, "--one", case, "--eps", str(eps), "--accounting", accounting,
                       "--seed", str(args.seed)] + (["--pgm"] if args.pgm else []) + \
                    (["--time-limit", str(args.time_limit)] if args.time_limit else []) + \
                    (["--no-mwem"] if args.no_mwem else []) + ["--estimators", *args.estimators] + \
                    (["--attrs", *args.attrs] if args.attrs else [])
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    print(f"{case} {accounting} eps={eps}: FAILED\n{out.stderr[-2000:]}", flush=True)
                    continue
                result = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"\n== {case}, {accounting}, eps = {eps} (peak {result['peak_mb']:.0f} MB)", flush=True)
                for row in result["rows"]:
                    err = f"{row['error']:.4f}" if "error" in row else "-"
                    net = f"{row['error_vs_network']:.4f}" if "error_vs_network" in row else "-"
                    secs = f"{row['seconds']:8.1f} s" if "seconds" in row else " " * 10
                    extra = "".join(f" {k} {row[k]:.3g}" if isinstance(row[k], float) else f" {k} {row[k]}"
                                    for k in ("objective", "cpu_seconds", "gap", "iterations", "stopped",
                                              "incumbent_error", "error_subset", "mode", "all_fits", "total",
                                              "total_held", "history")
                                    if row.get(k) is not None)
                    print(f"  {row['method']:<28} error {err:>8}  vs network {net:>8}  {secs}  "
                          f"{row.get('status', '')} {row.get('polytope', '')}{extra}", flush=True)
                results.append({"case": case, "accounting": accounting, "eps": eps, **result})
    if args.plot:
        plot(results, args.plot)


def plot(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_err, ax_time) = plt.subplots(1, 2, figsize=(10, 4))
    for accounting in ("zcdp", "pure"):
        for method in ("space", "auto wide (", "mwem", "independent (exact 1-way)"):
            points = []
            for r in results:
                if not r["case"].startswith("bn") or not r["case"].endswith("k2") or r["accounting"] != accounting:
                    continue
                row = next((x for x in r["rows"] if x["method"].startswith(method)), None)
                if row and "error" in row:
                    points.append((int(r["case"][2:].split("k")[0]), row["error"], row.get("seconds")))
            if not points or (method.startswith("independent") and accounting == "pure"):
                continue
            points.sort()
            label = method if method.startswith("independent") else f"{method.rstrip(' (')} ({accounting})"
            style = {"color": COLORS[method.rstrip(" (")], "linestyle": "-" if accounting == "zcdp" else "--",
                     "marker": "o"}
            ax_err.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
            if points[0][2] is not None:
                ax_time.plot([p[0] for p in points], [p[2] for p in points], label=label, **style)
    ax_err.set(xlabel="attributes d (all 2-way marginals)", ylabel="mean L1 error / n", yscale="log")
    ax_time.set(xlabel="attributes d", ylabel="seconds", yscale="log")
    ax_err.legend(fontsize=8)
    ax_time.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
