"""Audit a user's release spec on tiny synthetic datasets over its (down-scaled) domain.

``dpopt audit SPEC`` never reads the spec's data. It plans the spec without data, keeps a few
values of each attribute until at most ``domain_limit`` cells can hold a record
(:func:`dpopt.audit.domain.shrink`: every parent keeps children, structural zeros are kept
where they fit, attributes left with one value are dropped when the spec plans without them),
and audits the spec's algorithm, planned again on that domain with the spec's parameters,
budget and public constraints (restricted exactly; a constraint whose values belong to the full
domain is dropped, and the report says so). Parameters sized for the data's number of records
are resized by the algorithm's own documented rule (:meth:`~dpopt.algorithms.base.Algorithm.resized`)
and the report says how. The datasets are neighbours of a few records each
(:func:`dpopt.audit.audit`). Invariants the spec publishes from the data are published from each
tiny dataset the same way, and kept equal between neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpopt.audit.defaults import DEFAULT_DOMAIN_LIMIT, DEFAULT_EXCESS, DEFAULT_RUNS, DEFAULT_TIME_BUDGET
from dpopt.audit.domain import AuditDomain, restricted_rules, shrink
from dpopt.audit.harness import audit
from dpopt.audit.report import AuditReport, write_audit
from dpopt.audit.targets import MAX_AUDIT_CELLS, AlgorithmTarget
from dpopt.errors import DpoptError, InconsistentConstraintsError, SpecError
from dpopt.model.constraints import ConstraintSet
from dpopt.model.domain import Domain

__all__ = ["audit_spec", "spec_target", "downscale", "DEFAULT_DOMAIN_LIMIT", "audit_dir"]


def downscale(domain: Domain, limit: int, constraints=()) -> tuple[Domain, str | None]:
    """The audit domain of ``domain`` (:func:`dpopt.audit.domain.shrink`) and a sentence saying
    what was kept (None when ``domain`` fits as it is)."""
    shrunk = shrink(domain, constraints, limit, MAX_AUDIT_CELLS)
    return shrunk.domain, shrunk.describe()


def _restrict_constraints(p, shrunk: AuditDomain) -> tuple[ConstraintSet, list, list[str]]:
    """The spec's public constraints on the audit domain, its data invariants, and what was dropped."""
    from dpopt.spec import build_query

    small = shrunk.domain
    kept, notes = [], list(shrunk.notes)
    for c in p.constraints:
        if c.kind in ("nonnegative", "integer"):
            kept.append(c)
        elif c.kind not in ("structural_zero", "hierarchy"):
            notes.append(f"{c.kind} {c.name!r} dropped: its values belong to the full domain")
    kept += restricted_rules(shrunk)
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


@dataclass
class _Public:
    """What the audit reads of a spec: its public objects over the full domain, no algorithm plan."""

    spec: object
    domain: Domain
    constraints: ConstraintSet
    data_invariants: list
    algorithm: object
    budget: object


def _public(spec) -> _Public:
    """The spec's domain, public constraints and data invariants, as a release plans them, without
    planning its algorithm on the full domain (the audit plans it on the audit domain; a plan
    over the full domain can take minutes: the matrix mechanism's strategies on 4,357 cells)."""
    from dpopt.release.plan import check_constraints, declared_constraints

    domain, constraints, invariants = declared_constraints(spec)
    check_constraints(spec, constraints, when="before any audit run")
    return _Public(spec, domain, constraints, invariants, spec.algorithm, spec.budget)


def spec_target(spec, domain_limit: int = DEFAULT_DOMAIN_LIMIT,
                max_records: int = 2) -> tuple[AlgorithmTarget, AuditDomain, list[str]]:
    """What :func:`audit_spec` audits: the spec's algorithm on its audit domain, the domain, and notes.

    The algorithm is resized for datasets of ``max_records`` records by its own rule
    (:meth:`~dpopt.algorithms.base.Algorithm.resized`); the notes say what was dropped or resized.
    """
    from dpopt.spec import load_spec

    spec = load_spec(spec)
    p = _public(spec)
    algorithm, resized = p.algorithm.resized(max_records, p.budget)
    shrunk = shrink(p.domain, p.constraints, domain_limit, MAX_AUDIT_CELLS)
    target, shrunk, notes = _target(p, shrunk, algorithm, spec.name)
    return target, shrunk, notes + ([resized] if resized else [])


def _target(p, shrunk: AuditDomain, algorithm, name: str) -> tuple[AlgorithmTarget, AuditDomain, list[str]]:
    """The spec's algorithm planned on the audit domain: without the attributes left with one
    value when it plans so (:meth:`~dpopt.audit.domain.AuditDomain.without_single_valued`), else
    with them."""
    dropped = shrunk.without_single_valued()
    for candidate in ([dropped, shrunk] if dropped is not shrunk else [shrunk]):
        try:
            cs, invariants, notes = _restrict_constraints(p, candidate)
            fitted = algorithm.without_attributes(candidate.dropped) if candidate is dropped else algorithm
            return AlgorithmTarget(fitted, candidate.domain, p.budget, cs, invariants, name=name), candidate, notes
        except DpoptError as exc:
            if candidate is shrunk:
                raise SpecError(f"the spec's algorithm cannot be planned on the audit domain {candidate.domain} "
                                f"({exc}); raise --domain-limit") from None
    raise AssertionError("unreachable")


def audit_dir(spec) -> Path:
    """Where ``dpopt audit`` writes by default: beside the release, ``<release dir>-audit``."""
    release = spec.output.dir or Path("dpopt-out") / spec.name
    return Path(f"{release}-audit")


def audit_spec(spec, *, runs: int | str = DEFAULT_RUNS, domain_limit: int = DEFAULT_DOMAIN_LIMIT, out=None,
               overwrite: bool = False, workers: int | None = None, seed: int = 0, progress: bool = False,
               screen_runs: int | None = None, max_records: int = 2, max_pairs: int | None = None,
               keep_pairs: int = 2, excess: float = DEFAULT_EXCESS, time_budget: float = DEFAULT_TIME_BUDGET,
               echo=None) -> AuditReport:
    """Audit ``spec``'s algorithm on tiny datasets over its domain (module notes); never reads its data.

    Parameters
    ----------
    spec
        A spec path, built-in name, dict or :class:`~dpopt.spec.ReleaseSpec`.
    runs, screen_runs, max_records, max_pairs, keep_pairs, workers, seed, progress, excess, time_budget
        See :func:`dpopt.audit.audit` (``runs = "auto"`` sizes the test for ``excess``).
    domain_limit : int
        At most this many cells of the audit domain may hold a record
        (:func:`dpopt.audit.domain.shrink`).
    out : path, optional
        Write the audit report there (atomically); None writes nothing.
    echo : callable, optional
        Receives progress lines and time estimates (e.g. ``print``).
    """
    from dpopt.spec import load_spec

    spec = load_spec(spec)
    target, shrunk, notes = spec_target(spec, domain_limit, max_records)
    small, scaled = shrunk.domain, shrunk.describe()
    if out is not None:
        from dpopt.atomic import check_output_dir

        check_output_dir(out, overwrite=overwrite)
    if echo is not None:
        echo(f"dpopt: auditing {spec.name!r} ({spec.algorithm.describe()}) on synthetic datasets of at most "
             f"{max_records} records over {small.size} cells" + (f"; {scaled}" if scaled else ""))
        for note in notes:
            echo(f"  note: {note}")
    report = audit(target, runs=runs, screen_runs=screen_runs, max_records=max_records, max_pairs=max_pairs,
                   keep_pairs=keep_pairs, workers=workers, seed=seed, progress=progress, excess=excess,
                   time_budget=time_budget, echo=echo)
    report.notes = ([scaled] if scaled else []) + notes + report.notes
    report.settings.update(spec=str(spec.source or spec.name), domain_cells=small.size,
                           possible_cells=shrunk.possible, domain=small.to_dict(), domain_limit=domain_limit)
    if out is not None:
        report.settings["out"] = str(out)
        write_audit(report, out, overwrite=overwrite)
    return report
