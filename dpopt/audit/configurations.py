"""Audit configurations: the shipped algorithms set up so that a leak, if there is one, is visible.

An audit can only certify what its events can see. A shipped spec is tuned for accuracy at
scale: MWEM's 30 rounds overwrite what its first round measured, the polynomial release hides
its noisy record count in every answer at once, and top-down's zCDP budget with published
state totals is audited at a claim of ε = 17.86, beyond any sampling test (docs: "What the
audit cannot see"). An auditor chooses the configuration instead -- the same algorithm, the
same code path, with parameters that concentrate the privacy loss in few released statistics
and keep the claim small -- as a tester picks the input that exercises a branch. Each
configuration here is the shipped spec with a few keys replaced, and says why
(:data:`AUDIT_CONFIGURATIONS`; :func:`configured_spec` builds it). None of them knows of a
planted bug: they are what an auditor of the real algorithm would run.

An algorithm may have several configurations (:func:`configurations`): the main one of
:data:`AUDIT_CONFIGURATIONS` and further ones of :data:`FURTHER_CONFIGURATIONS`, each seeing
what another cannot. The correct algorithm must pass every one; a planted bug is caught when any
one catches it. Top-down has two: with the census edit rules (structural zeros), where a halved
scale is caught, and without them, where every cell can hold a record, so an answer the rules
would fix at 0 is tested too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

__all__ = ["AuditConfiguration", "AUDIT_CONFIGURATIONS", "FURTHER_CONFIGURATIONS", "MAIN", "configurations",
           "configured_spec"]


@dataclass(frozen=True)
class AuditConfiguration:
    """A shipped spec with some keys replaced (``None`` removes a key), and why."""

    spec: str
    replace: dict = field(default_factory=dict)
    why: str = ""


#: The key of each algorithm's main configuration (:data:`AUDIT_CONFIGURATIONS`).
MAIN = "main"

#: Top-down's main configuration: pure epsilon = 1, no published totals, each level's detailed table.
_TOPDOWN = {"privacy": {"accounting": "pure", "epsilon": 1.0, "rho": None},
            "constraints": {"invariants": None},
            "measure": [{"level": "nation", "label": "detailed", "query": "identity", "share": 0.1},
                        {"level": "state", "label": "detailed", "query": "identity", "share": 0.1},
                        {"level": "county", "label": "detailed", "query": "identity", "share": 0.8}]}

#: The audit configuration of one shipped spec per algorithm (module notes).
AUDIT_CONFIGURATIONS = {
    "measure_reconstruct": AuditConfiguration("quickstart", {}, "the quickstart as shipped"),
    "mwem": AuditConfiguration(
        "nltcs_mwem", {"mwem": {"rounds": 1, "count_share": 0.75, "transcript": True}},
        "one round (T = 1), so what the round measures is what the table is fitted to (later rounds "
        "overwrite it); a noisy record count (count_share = 0.75, MWEM's documented option) in place "
        "of the public n, so neighbours add or remove a record and the claim is not doubled, and most "
        "of the budget is in one released statistic, the table's total; the measurement transcript "
        "(transcript = true: the noisy count and answer as drawn, which the integer table hides) is "
        "released and its noisy answers audited with the table, which is computed from them and the "
        "selection: the bound covers both"),
    "dualquery": AuditConfiguration(
        "kdd99_dualquery", {"dualquery": {"count_share": 0.75, "transcript": True}},
        "a noisy record count (count_share = 0.75) in place of the public n: neighbours add or remove "
        "a record, and most of the budget is in one released statistic, the number of records; the "
        "measurement transcript (transcript = true: the noisy count as drawn, which the integer n the "
        "game uses hides) is released and audited with the records"),
    "polynomial": AuditConfiguration(
        "nltcs_polynomial",
        {"polynomial": {"workload": [["item01"]], "queries": "disjunctions", "universe": "monotone", "records": None,
                        "consistency": None}},
        "one monotone disjunction (item01) with the exact polynomial (no public records size: t = k = 1, "
        "gamma = 0): the release measures one coefficient group, without the record count (a disjunction's "
        "polynomial has p(0) = 0), and its answer is that count, so the whole budget is in one released "
        "statistic. With marginals the count is measured too and each cell is n minus a noisy literal "
        "count: the count's noise is in every cell, but no released statistic shows it alone"),
    "topdown": AuditConfiguration(
        "census_topdown", _TOPDOWN,
        "pure epsilon = 1 (discrete Laplace) without the published state totals, so the claim is 1 for "
        "added or removed records instead of 17.86 (rho = 1 at delta = 1e-6, doubled for moved records); "
        "each level's detailed table only, the counties' with 0.8 of the budget, so that most of a "
        "record's privacy loss is in one released county cell"),
}


#: Further configurations of some algorithms, by a short key (module notes).
FURTHER_CONFIGURATIONS = {
    "topdown": {
        "no-zeros": AuditConfiguration(
            "census_topdown", {**_TOPDOWN, "constraints": {"invariants": None, "structural_zeros": None}},
            "the main top-down configuration without the census edit rules (structural zeros; the "
            "state-county hierarchy stays): every cell of the audit domain can hold a record, so every "
            "released answer changes between some neighbours, those the rules fix at 0 included. The audit "
            "domain then keeps sex instead of household type"),
    },
}


def configurations(algorithm: str) -> dict:
    """Every audit configuration of ``algorithm`` by key, the main one (:data:`MAIN`) first."""
    from dpopt.errors import ParameterError

    if algorithm not in AUDIT_CONFIGURATIONS:
        raise ParameterError(f"no audit configuration for {algorithm!r}; choose from {sorted(AUDIT_CONFIGURATIONS)}")
    return {MAIN: AUDIT_CONFIGURATIONS[algorithm], **FURTHER_CONFIGURATIONS.get(algorithm, {})}


def _replaced(raw: dict, changes: dict) -> dict:
    out = copy.deepcopy(raw)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _replaced(out[key], value)
        else:
            out[key] = value
    return out


def configured_spec(algorithm: str, key: str = MAIN):
    """The :class:`~dpopt.spec.ReleaseSpec` of ``algorithm``'s audit configuration ``key`` (module notes)."""
    from dpopt.errors import ParameterError
    from dpopt.spec import load_spec, parse_spec

    known = configurations(algorithm)
    if key not in known:
        raise ParameterError(f"{algorithm!r} has no audit configuration {key!r}; choose from {', '.join(known)}")
    config = known[key]
    spec = load_spec(config.spec)
    if not config.replace:
        return spec
    return parse_spec(_replaced(spec.raw, config.replace), source=spec.source, base_dir=spec.base_dir)
