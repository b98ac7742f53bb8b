"""Audit a user's release spec on tiny synthetic datasets over its (down-scaled) domain.

``dpopt audit SPEC`` never reads the spec's data. It plans the spec without data, keeps the
first values of each attribute until the domain has at most ``domain_limit`` cells (the
spec's algorithm, budget and public constraints are kept; a constraint that cannot be stated
on the smaller domain is dropped, and the report says so), and audits the spec's algorithm on
neighbouring datasets of a few records each (:func:`dpopt.audit.audit`). Invariants the spec
publishes from the data are published from each tiny dataset the same way, and kept equal
between neighbours.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dpopt.audit.defaults import DEFAULT_DOMAIN_LIMIT
from dpopt.audit.harness import DEFAULT_RUNS, audit, default_max_pairs, default_screen_runs
from dpopt.audit.report import AuditReport, write_audit
from dpopt.audit.targets import AlgorithmTarget
from dpopt.errors import DpoptError, InconsistentConstraintsError, SpecError
from dpopt.model.constraints import ConstraintSet, Hierarchy
from dpopt.model.domain import Domain

__all__ = ["audit_spec", "downscale", "DEFAULT_DOMAIN_LIMIT", "audit_dir"]


def downscale(domain: Domain, limit: int) -> tuple[Domain, str | None]:
    """The first values of each attribute, as many as fit ``limit`` cells (balanced, domain order).

    Returns the domain unchanged when it already fits, with None; else the smaller domain and a
    sentence saying what was kept.
    """
    if limit < 2:
        raise SpecError(f"--domain-limit: must be at least 2 cells, got {limit}")
    if domain.size <= limit:
        return domain, None
    keep = [1] * len(domain)
    changed = True
    while changed:
        changed = False
        for i, size in enumerate(domain.sizes):
            product = int(np.prod(keep))
            if keep[i] < size and product // keep[i] * (keep[i] + 1) <= limit:
                keep[i] += 1
                changed = True
    spec = {}
    for a, k in zip(domain.attrs, keep):
        spec[a] = list(domain.labels[a][:k]) if a in domain.labels else k
    small = Domain.from_dict(spec)
    kept = ", ".join(f"{a} {k} of {n}" for a, k, n in zip(domain.attrs, keep, domain.sizes))
    return small, f"down-scaled from {domain.size:,} to {small.size} cells (values kept: {kept})"


def _restrict_constraints(p, small: Domain) -> tuple[ConstraintSet, list, list[str]]:
    """The spec's public constraints on the smaller domain, its data invariants, and what was dropped."""
    from dpopt.spec import build_query

    kept, notes, zeros_dropped = [], [], []
    for c in p.constraints:
        kind = c.kind
        try:
            if kind in ("nonnegative", "integer"):
                kept.append(c)
            elif kind == "structural_zero":
                try:
                    c.pattern(small)  # binds the predicate: it must name values the smaller domain has
                except (DpoptError, ValueError, KeyError, SyntaxError):
                    zeros_dropped.append(c.name)
                    continue
                kept.append(c)
            elif kind == "hierarchy":
                children = set(small.labels_of(c.child))
                parent_of = {k: v for k, v in c.parent_of.items() if k in children or
                             (isinstance(k, (int, np.integer)) and 0 <= int(k) < small.size_of(c.child))}
                restricted = Hierarchy(c.parent, c.child, parent_of, name=c.name)
                restricted.pattern(small)
                kept.append(restricted)
            else:
                notes.append(f"{kind} {c.name!r} dropped: its values belong to the full domain")
        except (DpoptError, ValueError, KeyError, SyntaxError) as exc:
            notes.append(f"{kind} {c.name!r} dropped: it cannot be stated on the audit domain ({exc})")
    if zeros_dropped:
        notes.insert(0, "structural zeros dropped (they name values the audit domain does not keep): "
                        + ", ".join(zeros_dropped))
    cs = ConstraintSet(small, kept)
    invariants = []
    for name, _, path in p.data_invariants:
        spec_inv = next(i for i in p.spec.constraints.invariants if i.path == path)
        try:
            ((_, query),) = build_query(spec_inv.query, small, lambda path, msg: SpecError(msg))
        except DpoptError as exc:
            notes.append(f"invariant {name!r} dropped: {exc}")
            continue
        invariants.append((name, query))
    try:
        cs.check()
    except InconsistentConstraintsError as exc:
        raise SpecError(f"the spec's constraints contradict each other on the audit domain ({exc}); "
                        "raise --domain-limit") from None
    return cs, invariants, notes


def audit_dir(spec) -> Path:
    """Where ``dpopt audit`` writes by default: beside the release, ``<release dir>-audit``."""
    release = spec.output.dir or Path("dpopt-out") / spec.name
    return Path(f"{release}-audit")


def audit_spec(spec, *, runs: int = DEFAULT_RUNS, domain_limit: int = DEFAULT_DOMAIN_LIMIT, out=None,
               overwrite: bool = False, workers: int | None = None, seed: int = 0, progress: bool = False,
               screen_runs: int | None = None, max_records: int = 2, echo=None) -> AuditReport:
    """Audit ``spec``'s algorithm on tiny datasets over its domain (module notes); never reads its data.

    Parameters
    ----------
    spec
        A spec path, built-in name, dict or :class:`~dpopt.spec.ReleaseSpec`.
    runs, screen_runs, max_records, workers, seed, progress
        See :func:`dpopt.audit.audit`.
    domain_limit : int
        At most this many cells in the audit domain.
    out : path, optional
        Write the audit report there (atomically); None writes nothing.
    echo : callable, optional
        Receives progress lines (e.g. ``print``).
    """
    from dpopt.release import plan
    from dpopt.spec import load_spec

    spec = load_spec(spec)
    p = plan(spec, data=pd.DataFrame())  # the public objects only: the data are never read
    small, scaled = downscale(p.domain, domain_limit)
    cs, invariants, notes = _restrict_constraints(p, small)
    try:
        target = AlgorithmTarget(p.algorithm, small, p.budget, cs, invariants, name=spec.name)
    except DpoptError as exc:
        raise SpecError(f"the spec's algorithm cannot be planned on the audit domain {small} ({exc}); "
                        "raise --domain-limit") from None
    if out is not None:
        from dpopt.atomic import check_output_dir

        check_output_dir(out, overwrite=overwrite)
    if echo is not None:
        echo(f"dpopt: auditing {spec.name!r} ({p.algorithm.describe()}) on synthetic datasets of at most "
             f"{max_records} records over {small.size} cells" + (f"; {scaled}" if scaled else ""))
        for note in notes:
            echo(f"  note: {note}")
        _estimate(target, runs, screen_runs, workers, echo)
    report = audit(target, runs=runs, screen_runs=screen_runs, max_records=max_records, workers=workers,
                   seed=seed, progress=progress)
    report.notes = ([scaled] if scaled else []) + notes + report.notes
    report.settings.update(spec=str(spec.source or spec.name), domain_cells=small.size,
                           domain=small.to_dict(), domain_limit=domain_limit)
    if out is not None:
        report.settings["out"] = str(out)
        write_audit(report, out, overwrite=overwrite)
    return report


def _estimate(target, runs, screen_runs, workers, echo) -> None:
    """Time a few runs and say roughly how long the audit takes (on a shared machine, a guide only)."""
    import os

    from dpopt.model.data import Dataset
    from dpopt.privacy.randomness import SeededRandom

    ones = np.zeros(target.domain.size, dtype=np.int64)
    ones[target.allowed_cells()] = 1
    data = Dataset.from_histogram(ones, target.domain)
    rng = SeededRandom(2**31 - 1)  # a pilot of the audit's own runs: seeded, never a release
    target.prepare(data, rng)
    start = time.perf_counter()
    for _ in range(5):
        target.run(data, rng)
    per_run = (time.perf_counter() - start) / 5
    cores = max(1, min(workers or os.cpu_count() or 1, os.cpu_count() or 1))
    if screen_runs is None:
        screen_runs = default_screen_runs(runs)
    pairs = default_max_pairs(runs)
    total = 3 * runs + 2 * pairs * screen_runs  # test + search over two pairs + the screening
    echo(f"  about {total:,} runs at {1e3 * per_run:.1f} ms each on {cores} worker{'s' if cores > 1 else ''}: "
         f"roughly {total * per_run / cores / 60:.1f} minutes (use --runs to trade power for time)")
    sys.stdout.flush()
