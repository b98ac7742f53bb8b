"""A statistical privacy audit of dpopt's mechanisms and registered algorithms.

``audit(target)`` runs the target on neighbouring tiny datasets chosen to stress it, searches
for the output event whose probability differs most between them (on one set of runs), and
tests it on fresh runs: a one-sided Clopper–Pearson lower bound on ε (δ-thinned under
(ε, δ)-DP) and Fisher's exact test at the claimed ε (StatDP, Ding et al. CCS 2018; DP-Sniper,
Bichsel et al. S&P 2021). A lower bound above the claim is a proof (at the test's confidence)
that the claim is false; a bound below it shows only that these runs found no violation.

Targets: :class:`~dpopt.audit.targets.AlgorithmTarget` (any registered algorithm, through its
``plan``/``run`` interface), the mechanisms of :mod:`dpopt.audit.mechanisms`, and the planted
bugs of :mod:`dpopt.audit.mutants` that check the auditor itself. :func:`audit_spec` audits a
user's spec on tiny datasets over its (down-scaled) domain, never on the real data.
"""

from __future__ import annotations

import importlib

# Loaded on first use, so that ``dpopt --help`` (which adds the audit's sub-parser from
# dpopt.audit.command) does not import scipy.stats and pandas.
_EXPORTS = {
    "AUDIT_DELTA": "dpopt.audit.claims", "Claim": "dpopt.audit.claims",
    "DEFAULT_RUNS": "dpopt.audit.harness", "DEFAULT_SCREEN_RUNS": "dpopt.audit.harness", "audit": "dpopt.audit.harness",
    "LIMITS": "dpopt.audit.report", "AuditReport": "dpopt.audit.report", "write_audit": "dpopt.audit.report",
    "AlgorithmTarget": "dpopt.audit.targets", "AuditTarget": "dpopt.audit.targets",
    "ledger_problem": "dpopt.audit.targets",
}

__all__ = ["audit", "audit_algorithm", "audit_spec", "AuditReport", "AuditTarget", "AlgorithmTarget", "Claim",
           "write_audit", "ledger_problem", "DEFAULT_RUNS", "DEFAULT_SCREEN_RUNS", "AUDIT_DELTA", "LIMITS"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dpopt.audit' has no attribute {name!r}")


def audit_algorithm(name_or_algorithm, domain, budget, *, params=None, constraints=None, **options) -> AuditReport:
    """Audit a registered algorithm (by name or instance) on ``domain`` with its ``example`` parameters.

    ``params`` overrides the example parameters; ``options`` go to :func:`audit`.
    """
    from dpopt.algorithms.base import Algorithm, get_algorithm
    from dpopt.audit.harness import audit
    from dpopt.audit.targets import AlgorithmTarget
    from dpopt.errors import ParameterError

    if isinstance(name_or_algorithm, Algorithm):
        algorithm = name_or_algorithm
    else:
        cls = get_algorithm(name_or_algorithm)
        params = params if params is not None else cls.example(domain)
        if params is None:
            raise ParameterError(f"{cls.name} has no example parameters on {domain}; give params")
        algorithm = cls(params)
    return audit(AlgorithmTarget(algorithm, domain, budget, constraints), **options)


def audit_spec(*args, **kwargs):
    """Audit a release spec on tiny datasets over its domain (see :func:`dpopt.audit.spec.audit_spec`)."""
    from dpopt.audit.spec import audit_spec as _audit_spec

    return _audit_spec(*args, **kwargs)
