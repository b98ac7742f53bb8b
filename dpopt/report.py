"""The release report: a JSON record of what was released, what it cost and how well it fits.

:func:`build_report` turns a :class:`~dpopt.release.ReleaseResult` into a JSON-ready dict:
the spec as written, the privacy ledger (exact fractions, with the check that it sums to the
declared budget), the solver's status and times, every constraint's residual on the
released table, the invariants published from the data, the seed when one was used (marked
NOT private), and with ``evaluate`` the errors against the confidential data (also marked
NOT private). :func:`render_markdown` and :func:`render_html` render the same dict as a
readable summary, so the summary never says anything the report does not.

The report never contains the confidential record count or any true answer, except in the
``evaluation`` section, which exists only when evaluation was asked for. What a release
writes is :func:`publishable` (the data file and the spec named by their base names only, so
no directory of the curator's machine is published); the report kept in memory
(``release.report``) has the full paths.
"""

from __future__ import annotations

import datetime as _dt
import enum
import html
import json
import math
import platform
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpopt.privacy.conversions import readable_amount
from dpopt.release.glossary import glossary_for

if TYPE_CHECKING:  # pragma: no cover
    from dpopt.release.outputs import ReleaseResult

NOT_PRIVATE_SEED = "seeded: NOT private (the noise is reproducible from the seed; use for testing only)"
#: The delta at which a zCDP budget's (epsilon, delta) equivalent is shown when the spec names none.
EQUIVALENT_DELTA = 1e-6
NOT_PRIVATE_EVALUATION = (
    "computed from the confidential data: NOT private, for testing only; do not publish"
)


def build_report(release: "ReleaseResult") -> dict:
    """The JSON report of a release (see the module notes for what it holds)."""
    import dpopt

    p = release.plan
    spec = p.spec
    acc = release.accountant
    ledger = acc.ledger_frame()
    comps = [c for c in ("epsilon", "delta", "rho") if c in ledger.columns]
    total = {c: getattr(acc.total, c) or Fraction(0) for c in comps}
    ledger_sum = {c: sum(ledger[c], Fraction(0)) for c in comps}
    planned = {m.label: m for m in p.steps}
    # Adaptive algorithms (auto's wide selection, MWEM) charge steps no plan lists: their noise is
    # read off the measurement of the same label, and an exponential-mechanism charge says so.
    drawn = {m.label: m for m in release.measurements}
    ledger_rows = []
    for _, row in ledger.iterrows():
        m = planned.get(row["label"])
        entry = {"label": row["label"]}
        for c in comps:
            entry[c] = str(row[c])
            entry[f"{c}_float"] = float(row[c])
            entry[f"cumulative_{c}"] = str(row[f"cumulative_{c}"])
        if m is not None:
            entry.update({"mechanism": m.mechanism, "share": str(m.share), "noise": m.noise,
                          "noise_stddev": m.stddev})
        elif row["label"] in drawn:
            got = drawn[row["label"]]
            entry.update({"mechanism": _mechanism_of(got.noise), "noise": got.noise, "noise_stddev": got.stddev})
        elif str(row["detail"] or "").startswith("exponential mechanism"):
            entry["mechanism"] = "exponential"
        entry["detail"] = str(row["detail"]) if row["detail"] is not None else None
        ledger_rows.append(entry)
    privacy = {
        "accounting": acc.kind,
        "budget": {c: str(v) for c, v in total.items()},
        "budget_float": {c: float(v) for c, v in total.items()},
        "ledger_sum": {c: str(v) for c, v in ledger_sum.items()},
        "ledger_sums_to_budget": all(ledger_sum[c] == total[c] for c in comps),
        "unspent": {c: str(total[c] - ledger_sum[c]) for c in comps if total[c] != ledger_sum[c]},
        "ledger": ledger_rows,
        "accountant_summary": acc.summary(),
        "published_without_noise": [
            {"invariant": inv.name, "query": inv.query.name,
             "note": "published exactly from the data on purpose (not private)"}
            for inv in release.constraints.invariants if inv.from_data
        ],
    }
    if acc.kind == "zcdp" and total.get("rho"):
        from dpopt.privacy.conversions import zcdp_to_approx_dp

        delta = getattr(acc, "_report_delta", None) or EQUIVALENT_DELTA
        privacy["approx_equivalent"] = {"epsilon": zcdp_to_approx_dp(total["rho"], delta), "delta": str(delta),
                                        "conversion": "Canonne, Kamath, Steinke 2020, Cor. 13"}
    seeded = p.seed is not None
    randomness = {
        "seeded": seeded,
        "seed": p.seed,
        "private": bool(release.random_is_private),
        "source": release.random_description,
    }
    if seeded:
        randomness["warning"] = NOT_PRIVATE_SEED
    res = release.reconstruction
    if res is not None:
        reconstruction = {
            "objective": res.objective,
            "backend": res.backend,
            "solver": res.solver,
            "status": _status(res.status),
            "success": bool(res.success),
            "message": str(res.message),
            "objective_value": _num(res.fun),
            "time_seconds": float(res.time),
            "iterations": res.nit,
            "time_limit": getattr(spec.reconstruct, "time_limit", None),
        }
    else:  # an iterative algorithm that reconstructs as it measures (no separate solve)
        reconstruction = {
            "objective": None, "backend": release.algorithm, "solver": release.title,
            "status": _status(release.status), "success": bool(release.success), "message": str(release.message),
            "objective_value": None, "time_seconds": float(release.timings.get(release.algorithm, 0.0)),
            "iterations": None, "time_limit": None,
        }
    rounding = release.rounding
    if rounding is not None:
        rinfo = rounding.info or {}
        reconstruction["rounding"] = {
            "status": _status(rounding.status),
            "message": str(rounding.message),
            "l1_change": _num(rounding.fun),
            "time_seconds": _num(rounding.time),
            "method": rinfo.get("method"),
            "measured_change": _jsonable(_records(rinfo.get("measured_change"))),
            **{k: _jsonable(_records(rinfo[k])) for k in ("exceptions", "gap", "fallback", "relaxed")
               if rinfo.get(k) is not None and not (isinstance(rinfo[k], pd.DataFrame) and rinfo[k].empty)},
        }
    x = None if release.counts is None else np.asarray(release.counts, dtype=np.float64)
    described = {row["constraint"]: row for row in release.constraints.describe()}
    constraints = []
    for row in release.constraints.residuals(x) if x is not None else []:
        d = described.get(row["constraint"], {})
        constraints.append({"constraint": row["constraint"], "kind": d.get("kind"), "detail": d.get("detail"),
                            "max_violation": float(row["max_violation"]), "satisfied": bool(row["satisfied"])})
    if x is None and release.answers:
        constraints = _answer_constraints(release, described)
    invariants = []
    for inv in release.constraints.invariants:
        invariants.append({"name": inv.name, "query": inv.query.name, "from_data": bool(inv.from_data),
                           "rows": inv.query.row_labels(), "values": [_num(v) for v in inv.values],
                           "released": [_num(v) for v in inv.query.matvec(x)] if x is not None else None})
    measurements = []
    for m in release.measurements:
        measurements.append({"label": m.label, "query": m.query.name, "answers": m.query.num_rows,
                             "noise": m.noise, "scale": m.scale, "stddev": m.stddev,
                             "cost": str(m.cost) if m.cost is not None else None})
    fit = []
    for m in release.measurements if x is not None else []:
        r = m.query.matvec(x) - m.values
        fit.append({"measurement": m.label, "rms_residual": float(np.sqrt(np.mean(r**2))),
                    "rms_standardized": float(np.sqrt(np.mean(r**2)) / m.stddev) if m.stddev > 0 else None,
                    "max_abs_residual": float(np.abs(r).max())})
    algorithm = {"name": release.algorithm, "title": release.title, "reference": release.reference,
                 "parameters": _jsonable(release.parameters), "notes": list(release.notes),
                 **_plain_info(release.info)}
    report = {
        "dpopt_version": dpopt.__version__,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "release": spec.name,
        "description": spec.description,
        "spec": {"source": str(spec.source) if spec.source else None, "settings": _jsonable(spec.raw)},
        "run": {
            "data": _data_text(p),
            "data_source": p.data_source,
            "seed": p.seed,
            "evaluate": release.evaluation is not None,
            "structural_zero_records": (spec.constraints.structural_zero_records
                                        if spec.constraints.structural_zeros else None),
        },
        "randomness": randomness,
        "domain": {
            "cells": p.domain.size,
            "attributes": [{"name": a, "size": p.domain.size_of(a), "labels": [str(v) for v in p.domain.labels_of(a)]}
                           for a in p.domain.attrs],
        },
        "privacy": privacy,
        "algorithm": algorithm,
        "status": _status(release.status),
        "measurements": measurements,
        "reconstruction": reconstruction,
        "constraints": constraints,
        "constraints_all_hold": all(c["satisfied"] for c in constraints),
        "max_violation": max((c["max_violation"] for c in constraints), default=0.0),
        "invariants": invariants,
        "fit": fit,
        "released": {
            "cells": int(x.size) if x is not None else 0,
            "nonzero_cells": int(np.count_nonzero(x)) if x is not None else 0,
            "total": _num(x.sum()) if x is not None else None,
            "integer": bool(spec.constraints.integer),
            "synthetic_rows": None if release.synthetic is None else int(len(release.synthetic)),
            "answers": _answer_rows(release.answers),
        },
        "evaluation": None,
        "timings": dict(release.timings),
        "environment": {"python": platform.python_version(), "numpy": np.__version__,
                        "pandas": pd.__version__, "platform": platform.platform()},
    }
    report["accuracy"] = accuracy_section(release)
    if release.evaluation is not None:
        report["evaluation"] = {
            "warning": NOT_PRIVATE_EVALUATION,
            "summary": _jsonable(release.evaluation_summary),
            "queries": _jsonable(release.evaluation.to_dict(orient="records")),
        }
    return report


def _answer_constraints(release: "ReleaseResult", described: dict) -> list[dict]:
    """Without a table, the cell-wise constraints checked on the released answers' counts
    (non-negativity and integrality); other kinds need the table and are not listed."""
    from dpopt.model.constraints import Integrality, NonNegativity

    kinds = [c for c in release.constraints.constraints if isinstance(c, (NonNegativity, Integrality))]
    if not kinds:
        return []
    counts = [np.asarray(frame["count"], dtype=np.float64) for frame in release.answers.values()
              if isinstance(frame, pd.DataFrame) and "count" in frame]
    values = np.concatenate(counts) if counts else np.zeros(0)
    rows = []
    for c in kinds:
        if isinstance(c, NonNegativity):
            v = float(max(0.0, -values.min())) if values.size else 0.0
        else:
            v = float(np.abs(values - np.round(values)).max()) if values.size else 0.0
        d = described.get(c.key, {})
        rows.append({"constraint": c.key, "kind": d.get("kind"),
                     "detail": "every released answer (no table was released)", "max_violation": v,
                     "satisfied": v <= 1e-6})
    return rows


def accuracy_section(release: "ReleaseResult") -> dict:
    """What the report says about accuracy, from public quantities only (see
    :mod:`dpopt.release.accuracy`): the plan's expected error per measured table, the fit's error
    bars, what consistency changed, and an algorithm's own accuracy statement."""
    from dpopt.release.accuracy import consistency_changes, fitted_error_bars, planned_accuracy

    bars, bars_why = fitted_error_bars(release)
    statement = release.info.get("accuracy_statement")
    return {
        "expected_before_data": planned_accuracy(release.plan),
        "expected_method": "weighted least squares over every measurement, constraints ignored "
                           "(Li et al. PODS 2010, Prop. 4); RMS error per answer",
        "error_bars": bars,
        "error_bars_method": "active-bound GLS covariance (cells at 0, structural zeros and invariants held); "
                             "RMS standard error per answer; probe estimate above "
                             "64 answers, with its own standard error",
        "error_bars_unavailable": bars_why,
        "consistency_changes": consistency_changes(release),
        "algorithm_statement": str(statement) if statement else None,
        "workload_tables": _jsonable(release.info.get("accuracy_tables")),
    }


def publishable(report: dict) -> dict:
    """The report as written into a release: the data file and the spec by base name only.

    The confidential data's directory (often a user name, a project, a site) has no place in
    a published file; a path given in the spec's own ``data.path`` or ``output.dir`` settings
    is cut to its base name too.
    """
    out = dict(report)
    run = dict(out.get("run") or {})
    if run.get("data_source") == "file" and isinstance(run.get("data"), str):
        run["data"] = Path(run["data"]).name
    out["run"] = run
    spec = dict(out.get("spec") or {})
    if spec.get("source"):
        spec["source"] = Path(spec["source"]).name
    settings = spec.get("settings")
    if isinstance(settings, dict):
        settings = dict(settings)
        for section, key in (("data", "path"), ("output", "dir"), ("domain", "json")):
            table = settings.get(section)
            if isinstance(table, dict) and isinstance(table.get(key), str):
                settings[section] = {**table, key: Path(table[key]).name}
        spec["settings"] = settings
    out["spec"] = spec
    return out


def write_json(report: dict, path: str | Path) -> None:
    """Write a report as indented JSON (fractions as strings, NaN as null)."""
    Path(path).write_text(json.dumps(_jsonable(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")


# ---- rendering ----------------------------------------------------------------------------------


def summary_blocks(report: dict) -> list[tuple]:
    """The summary as blocks ``(kind, ...)``: ``h1``/``h2``/``p``/``warn`` text, ``table``, ``img``, ``list``
    (of file names), ``bullets`` (of sentences)."""
    b: list[tuple] = [("h1", f"Release {report['release']}")]
    if report.get("description"):
        b.append(("p", report["description"]))
    rnd = report["randomness"]
    if report.get("not_private"):
        b.append(("warn", "NOT PRIVATE, do not publish: " + "; ".join(report["not_private"]) + "."))
    if rnd.get("seeded"):
        b.append(("warn", f"Seed {rnd['seed']}: {NOT_PRIVATE_SEED}."))
    rel = report["released"]
    if rel["total"] is not None:
        b.append(("p", f"{rel['cells']:,} cells ({rel['nonzero_cells']:,} non-zero), released total "
                   f"{_fmt(rel['total'])}" + (", integer counts" if rel["integer"] else "")
                   + (f"; {rel['synthetic_rows']:,} synthetic records" if rel["synthetic_rows"] is not None else "")
                   + f". Data: {report['run']['data']}. Noise source: {rnd['source']}."))
    else:
        names = list(rel["answers"])
        shown = "; ".join(names[:3]) + (f"; and {len(names) - 3:,} more" if len(names) > 3 else "")
        what = (f"{len(names):,} answer tables ({sum(rel['answers'].values()):,} answers in all: {shown})"
                if names else "no answer tables")
        if rel.get("synthetic_rows") is not None:
            what += f" and {rel['synthetic_rows']:,} synthetic records"
        b.append(("p", f"No table of counts was released: the algorithm released {what}. "
                       f"Data: {report['run']['data']}. Noise source: {rnd['source']}."))

    pr = report["privacy"]
    b.append(("h2", "Privacy"))
    budget = ", ".join(f"{k} = {v}" for k, v in pr["budget"].items())
    spent = ", ".join(f"{k} = {v}" for k, v in pr["ledger_sum"].items())
    b.append(("p", f"Accounting: {pr['accounting']}. Budget {budget}; the ledger sums to {spent}"
                   + (" (exactly the budget)." if pr["ledger_sums_to_budget"] else
                      f" (unspent: {', '.join(f'{k} = {v}' for k, v in pr['unspent'].items())}).")
                   + (f" As (epsilon, delta)-DP: epsilon = {_fmt(pr['approx_equivalent']['epsilon'])} at delta = "
                      f"{pr['approx_equivalent']['delta']} ({pr['approx_equivalent']['conversion']})."
                      if pr.get("approx_equivalent") else "")))
    comps = list(pr["budget"])
    rows = [[e["label"], e.get("mechanism", ""), *[readable_amount(Fraction(e[c])) for c in comps],
             _fmt(e.get("noise_stddev"))]
            for e in pr["ledger"]]
    b.append(("table", ["measurement", "mechanism", *comps, "noise std. dev."], rows))
    if pr["published_without_noise"]:
        b.append(("p", "Published exactly from the data, without noise (a deliberate choice, not private): "
                       + ", ".join(i["invariant"] for i in pr["published_without_noise"]) + "."))
    if report["run"].get("structural_zero_records") == "drop":
        b.append(("p", "Records falling in structural-zero cells were dropped before any measurement "
                       "(constraints.structural_zero_records = \"drop\"); whether there were any, and how many, "
                       "is not published."))

    rc = report["reconstruction"]
    b.append(("h2", "Reconstruction"))
    text = (f"Objective {rc['objective']}, backend {rc['backend']} ({rc['solver']}): status {rc['status']} "
            f"in {rc['time_seconds']:.2f} s." if rc["objective"] else
            f"{rc['solver']} ({rc['backend']}): status {rc['status']} in {rc['time_seconds']:.2f} s. {rc['message']}.")
    if "rounding" in rc:
        r = rc["rounding"]
        text += (f" Rounded to integers ({r.get('method')}): status {r['status']}, total change "
                 f"{_fmt(r['l1_change'])}.")
        if r.get("fallback"):
            text += f" Fallback: {r['fallback']}."
        if r.get("exceptions"):
            text += f" {len(r['exceptions'])} measured answers could not stay at the floor or ceiling of their fit."
    b.append(("p", text))

    b.extend(_accuracy_blocks(report))

    alg = report.get("algorithm")
    if alg and alg.get("notes"):
        params = ", ".join(f"{k} = {v}" for k, v in alg["parameters"].items()
                           if k not in ("marginals", "measures", "reconstruct"))
        b.append(("h2", "Algorithm"))
        b.append(("p", f"{alg['name']}: {alg['title']} ({alg['reference']})" + (f"; {params}." if params else ".")))
        b.append(("bullets", alg["notes"]))

    b.append(("h2", "Constraints"))
    if rel["total"] is None and not report["constraints"]:
        b.append(("p", "No table of counts was released and no constraint can be checked on the released answers "
                       "(none of the declared ones is cell-wise), so none is listed."
                       if (report["spec"]["settings"] or {}).get("constraints") else
                       "No table of counts was released and no constraint was declared, so there is nothing to "
                       "check a constraint on."))
    else:
        b.append(("p", ("Every constraint holds" if report["constraints_all_hold"] else "SOME CONSTRAINTS DO NOT HOLD")
                       + (" on the released table" if rel["total"] is not None else " on the released answers")
                       + f" (largest violation {_fmt(report['max_violation'])})."))
        b.append(("table", ["constraint", "detail", "max violation", "holds"],
                  [[c["constraint"], c["detail"] or "", _fmt(c["max_violation"]), "yes" if c["satisfied"] else "NO"]
                   for c in report["constraints"]]))

    changes = (report.get("accuracy") or {}).get("consistency_changes") or []
    if changes:
        b.append(("h2", "What consistency changed"))
        b.append(("p", "Per measured table: how far the released answers moved from the noisy ones (RMS over its "
                       "answers, also in units of the noise standard deviation; about 1 means each answer moved by "
                       "one noise standard deviation) and what moved them."))
        b.append(("table", ["measured table", "RMS change", "in noise s.d.", "max |change|", "noisy answers < 0",
                            "of which rounding (RMS)", "why"],
                  [[c["table"], _fmt(c["rms_change"]), _fmt(c["rms_change_in_noise_sd"]), _fmt(c["max_abs_change"]),
                    str(c["noisy_negative"]), _fmt(c["rounding_rms_change"]) if c["rounding_rms_change"] is not None
                    else "-", c["why"]] for c in changes]))

    ev = report.get("evaluation")
    if ev:
        b.append(("h2", "Accuracy against the confidential data"))
        b.append(("warn", f"This section is {NOT_PRIVATE_EVALUATION}."))
        s = ev["summary"]
        if "total_variation" in s:
            b.append(("p", f"Records: {s['records']:,}. Total variation distance of the released table: "
                           f"{_fmt(s['total_variation'])}; L1 error of the full table: {_fmt(s['l1_full_table'])}."))
            worse = s.get("worse_than_noisy") or []
            b.append(("p", "On every measured query the release is at least as close to the truth as its noisy "
                           "answers." if not worse else
                           "The release is further from the truth than its own noisy answers on: "
                           + "; ".join(f"{w['query']} (L1 error {_fmt(w['released_l1_error'])} against "
                                       f"{_fmt(w['noisy_l1_error'])}, {_fmt(w['excess'])} more)" for w in worse)
                           + ". In expectation consistency improves every measured query; one run can lose "
                             "where the noise happened to be small or a constraint pulls the answers."))
        else:
            b.append(("p", f"Records: {s['records']:,}. No table was released: {s['queries_evaluated']} released "
                           f"marginals compared; mean L1 error relative to the records "
                           f"{_fmt(s['mean_relative_l1'])}, largest cell error {_fmt(s['max_abs_error'])}."))
        b.append(("table", ["kind", "query", "answers", "L1 error", "L1 error of the noisy answers", "max |error|"],
                  [[q["kind"], q["query"], str(q["answers"]), _fmt(q["l1_error"]), _fmt(q["noisy_l1_error"]),
                    _fmt(q["max_abs_error"])] for q in ev["queries"]]))
        bounds = s.get("algorithm_bounds")
        if bounds:
            b.append(("p", "The algorithm's own accuracy statement: measured errors beside the bound its theorem "
                           "gives, per workload set."))
            header = list(bounds[0])
            b.append(("table", [h.replace("_", " ") for h in header],
                      [[_fmt(r.get(h)) if isinstance(r.get(h), float) else str(r.get(h)) for h in header]
                       for r in bounds]))

    if report.get("plots"):
        b.append(("h2", "Plots"))
        for name, rel_path in report["plots"].items():
            b.append(("img", name.replace("_", " "), rel_path))
    if report.get("files"):
        b.append(("h2", "Files"))
        b.append(("list", report["files"]))
    terms = glossary_for(_block_text(b), report)
    if terms:
        b.append(("h2", "Glossary"))
        b.append(("bullets", terms))
    return b


def _accuracy_blocks(report: dict) -> list[tuple]:
    acc = report.get("accuracy")
    if not acc:
        return []
    b: list[tuple] = [("h2", "Accuracy")]
    workload = acc.get("workload_tables")
    if workload:  # an algorithm that states its error per workload table (auto)
        b.append(("p", "Error per answer of each table the workload names, in counts (root mean square over its "
                       "answers). Expected error: the plan's figure before any data. Estimated error: Stein's "
                       "unbiased risk estimate of the released table, and of the noisy (or least-squares) answers "
                       "it improves on, from the noisy answers alone."))
        b.append(("table", ["workload table", "answers", "expected error (plan)", "estimated error (release)",
                            "estimated error (noisy or least-squares answers)"],
                  [[w["table"], str(w.get("answers") or "-"), _fmt(w.get("expected_rmse")),
                    _fmt(w.get("estimated_rmse")), _fmt(w.get("noisy_estimated_rmse"))] for w in workload]))
        return b
    table_released = report["released"]["total"] is not None
    planned = {r["table"]: r for r in acc.get("expected_before_data") or []} if table_released else {}
    bars = {r["table"]: r for r in acc.get("error_bars") or []}
    changes = {r["table"]: r for r in acc.get("consistency_changes") or []}
    tables = list(dict.fromkeys([*planned, *bars]))
    if tables:
        b.append(("p", "Error per answer of each measured table, in counts (root mean square over its answers). "
                       "Noisy answers: the noise standard deviation. Expected error: the plan's figure before any data "
                       "for a weighted least-squares fit of all measurements, constraints ignored (they usually "
                       "lower it). Error bar: the standard error of the released fit given the bounds it holds "
                       "(cells at 0, structural zeros, invariants); '±' is the estimate's own uncertainty."))
        rows = []
        for t in tables:
            p, e, c = planned.get(t, {}), bars.get(t), changes.get(t, {})
            bar = "-"
            if e is not None:
                bar = _fmt(e["rmse"]) + ("" if e["exact"] else f" ± {e['rmse_se']:.2g}")
                if not e["converged"]:
                    bar += " (solve stopped at its time limit: a lower figure)"
            rows.append([t, str(p.get("answers", e["answers"] if e else "")), _fmt(p.get("noise_rmse")),
                         _fmt(p.get("expected_rmse")) if p.get("expected_rmse") is not None else "-",
                         bar, _fmt(c.get("rounding_rms_change")) if c.get("rounding_rms_change") is not None else "-"])
        b.append(("table", ["measured table", "answers", "noisy answers (noise s.d.)", "expected error (plan)",
                            "error bar (fit)", "rounding (RMS)"], rows))
        reasons = sorted({p["why"] for p in planned.values() if p.get("why")})
        if reasons:
            b.append(("p", "No expected error before data where '-': " + "; ".join(reasons) + "."))
        if acc.get("error_bars_unavailable"):
            b.append(("p", f"No error bars after the fit: {acc['error_bars_unavailable']}."))
    if acc.get("algorithm_statement"):
        b.append(("p", f"The algorithm's own accuracy statement: {acc['algorithm_statement']}."))
    elif not tables:
        b.append(("p", "This algorithm states no data-free accuracy bound for its release; run with evaluation "
                       "(NOT private) to measure its error on test data."))
    return b


def _block_text(blocks: list[tuple]) -> str:
    parts = []
    for block in blocks:
        for item in block[1:]:
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, list):
                parts.extend(str(cell) for row in item for cell in (row if isinstance(row, list) else [row]))
    return " ".join(parts)


def render_markdown(report: dict) -> str:
    """The summary as Markdown."""
    out = []
    for block in summary_blocks(report):
        kind = block[0]
        if kind == "h1":
            out.append(f"# {block[1]}")
        elif kind == "h2":
            out.append(f"## {block[1]}")
        elif kind == "p":
            out.append(block[1])
        elif kind == "warn":
            out.append(f"> **Warning.** {block[1]}")
        elif kind == "table":
            header, rows = block[1], block[2]
            out.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            out.append("|" + "---|" * len(header))
            out.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows)
        elif kind == "img":
            out.append(f"![{block[1]}]({block[2]})")
        elif kind == "list":
            out.extend(f"- `{item}`" for item in block[1])
        elif kind == "bullets":
            out.extend(f"- {item}" for item in block[1])
        out.append("")
    return "\n".join(out)


def render_html(report: dict) -> str:
    """The summary as a self-contained HTML page (plots linked by relative path)."""
    e = html.escape
    body = []
    for block in summary_blocks(report):
        kind = block[0]
        if kind in ("h1", "h2"):
            body.append(f"<{kind}>{e(block[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{e(block[1])}</p>")
        elif kind == "warn":
            body.append(f'<p class="warn"><strong>Warning.</strong> {e(block[1])}</p>')
        elif kind == "table":
            head = "".join(f"<th>{e(str(h))}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in block[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif kind == "img":
            body.append(f'<figure><img src="{e(block[2])}" alt="{e(block[1])}"><figcaption>{e(block[1])}</figcaption></figure>')
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li><code>{e(i)}</code></li>" for i in block[1]) + "</ul>")
        elif kind == "bullets":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in block[1]) + "</ul>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.4}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .5em;"
             "text-align:left}.warn{background:#fff3cd;padding:.5em;border-left:4px solid #e0a800}"
             "img{max-width:100%}")
    title = e(f"dpopt release {report['release']}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# ---- helpers ----------------------------------------------------------------------------------


def _data_text(p) -> str:
    if p.data_source == "example":
        return f"generated example ({p.spec.data.rows:,} rows, data seed {p.spec.data.seed})"
    if p.data_source == "given":
        return "given in Python"
    return str(p.data_path)


def _plain_info(info: dict) -> dict:
    """An algorithm's ``info`` for the report: plain data (numbers, text, arrays, tables as records).

    Python objects kept for the API (plans, evaluators, mappings of frames) have no JSON form:
    their keys are listed under ``python_only`` instead of their ``repr`` (which cost seconds for
    a thousand frames and said nothing).
    """
    out, python_only = {}, []
    for key, value in info.items():
        if key == "spec_key":
            continue
        if isinstance(value, pd.DataFrame):
            out[key] = value.to_dict(orient="records")
        elif _is_plain(value):
            out[key] = value
        else:
            python_only.append(key)
    if python_only:
        out["python_only"] = python_only
    return out


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float, Fraction, enum.Enum, np.generic)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufU"
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _is_plain(v) for k, v in value.items())
    return False


def _records(value: Any) -> Any:
    """A DataFrame as a list of row dicts (other values as they are)."""
    return value.to_dict(orient="records") if isinstance(value, pd.DataFrame) else value


def _status(status: Any) -> str | None:
    if status is None:
        return None
    return getattr(status, "name", str(status))


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _mechanism_of(noise: str) -> str:
    """The mechanism's name from a measurement's noise family (``discrete_gaussian`` -> ``gaussian``)."""
    return noise.removeprefix("discrete_")


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    f = float(v)
    if not math.isfinite(f):
        return "–"
    if f == int(f) and abs(f) < 1e15:
        return f"{int(f):,}"
    return f"{f:.4g}"


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _jsonable(obj: Any) -> Any:
    """Plain JSON types: Fractions as strings, numpy scalars as numbers, NaN/inf as null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    if isinstance(obj, Fraction):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.name
    if isinstance(obj, (Path, _dt.date, _dt.datetime, _dt.time)):
        return str(obj)
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


def _answer_rows(answers) -> dict[str, int]:
    """Rows of each released answer table; a lazy mapping that knows its sizes (``rows(label)``, e.g.
    thousands of marginals) is not built just to count them."""
    rows = getattr(answers, "rows", None)
    if rows is not None:
        return {label: int(rows(label)) for label in answers}
    return {label: int(len(frame)) for label, frame in answers.items()}
