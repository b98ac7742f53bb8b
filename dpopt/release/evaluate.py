"""Errors of a release against the confidential data. NOT private: for testing only."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd

from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.model.measurement import Measurement

__all__ = ["evaluate_release"]


def evaluate_release(p, data: Dataset, counts: np.ndarray, measurements: list[Measurement],
                     constraints: ConstraintSet) -> tuple[pd.DataFrame, dict, dict[str, np.ndarray]]:
    """Errors of the release against the confidential data. NOT private: for testing only.

    Rows: every measured query (L1 error of the released answers and of the raw noisy
    answers), every invariant, and every 1- and 2-way marginal (held-out workload when not
    measured). Summary: total variation distance and L1 error of the full table.
    """

    from dpopt.model.queries.marginal import Marginal

    truth = data.histogram().astype(np.float64)
    x = np.asarray(counts, dtype=np.float64)
    n_true = float(truth.sum())
    rows = []
    truths = {}

    def add(kind, label, query, noisy=None):
        t = query.answer(data).astype(np.float64)
        if kind == "measured":
            truths[label] = t
        r = query.matvec(x)
        row = {"kind": kind, "query": label, "answers": query.num_rows,
               "l1_error": float(np.abs(r - t).sum()), "max_abs_error": float(np.abs(r - t).max()),
               "relative_l1": float(np.abs(r - t).sum() / max(n_true, 1.0)),
               "noisy_l1_error": float(np.abs(noisy - t).sum()) if noisy is not None else float("nan")}
        rows.append(row)

    measured = set()
    for m in measurements:
        add("measured", m.label, m.query, m.values)
        if isinstance(m.query, Marginal):
            measured.add(m.query.attrs)
    for inv in constraints.invariants:
        add("invariant", inv.name, inv.query)
    for k in (1, 2):
        if k > len(p.domain):
            continue
        for attrs in combinations(p.domain.attrs, k):
            if attrs not in measured:
                add(f"{k}-way marginal", ", ".join(attrs), Marginal(p.domain, attrs))
    frame = pd.DataFrame(rows)
    total_released = float(x.sum())
    tv = 0.5 * float(np.abs(x / max(total_released, 1.0) - truth / max(n_true, 1.0)).sum())
    summary = {
        "records": int(n_true),
        "released_total": total_released,
        "l1_full_table": float(np.abs(x - truth).sum()),
        "total_variation": tv,
        "mean_relative_l1_measured": float(frame.loc[frame["kind"] == "measured", "relative_l1"].mean()),
        "worse_than_noisy": worse_than_noisy(frame),
    }
    return frame, summary, truths


def worse_than_noisy(frame: pd.DataFrame) -> list[dict]:
    """The measured queries on which the release is further from the truth than its own noisy answers.

    Consistency should make a release *better* than the noisy answers it came from; in one run it
    can lose on a query (the noise may happen to be small there, or a constraint may pull the
    answers away), so the report names each such query and by how much.
    """
    measured = frame[frame["kind"] == "measured"]
    worse = measured[measured["l1_error"] > measured["noisy_l1_error"]]
    return [{"query": row.query, "released_l1_error": float(row.l1_error), "noisy_l1_error": float(row.noisy_l1_error),
             "excess": float(row.l1_error - row.noisy_l1_error)} for row in worse.itertuples()]



def evaluate_without_table(p, data: Dataset, release) -> tuple[pd.DataFrame, dict, dict[str, np.ndarray]]:
    """Errors of a release that has no table (answers or records only). NOT private: for testing only.

    Rows: every released answer table whose columns are attributes of the domain (a marginal),
    against the same marginal of the data; and, for released records, every 1- and 2-way
    marginal of the records scaled to the data's record count.
    """
    n_true = float(data.total)
    rows, truths = [], {}

    def add(kind, label, attrs, released):
        truth = data.marginal(attrs).astype(np.float64)
        err = np.abs(np.asarray(released, dtype=np.float64) - truth)
        truths[label] = truth
        rows.append({"kind": kind, "query": label, "answers": int(truth.size), "l1_error": float(err.sum()),
                     "max_abs_error": float(err.max()), "relative_l1": float(err.sum() / max(n_true, 1.0)),
                     "noisy_l1_error": float("nan")})

    for label, frame in release.answers.items():
        attrs = [c for c in frame.columns if c in p.domain.attrs]
        if not attrs or "count" not in frame.columns:
            continue
        attrs = list(p.domain.canonical(attrs))
        truth_frame = data.marginal_frame(attrs)
        merged = truth_frame.drop(columns="count").merge(frame[attrs + ["count"]], on=attrs, how="left")
        add("answers", label, attrs, merged["count"].fillna(0.0).to_numpy())
    if release.records is not None and len(release.records):
        synthetic = Dataset.from_frame(release.records, p.domain)
        scale = n_true / float(synthetic.total)
        for k in (1, 2):
            for attrs in combinations(p.domain.attrs, k):
                add(f"{k}-way marginal of the records", ", ".join(attrs), list(attrs),
                    synthetic.marginal(list(attrs)) * scale)
    frame = pd.DataFrame(rows, columns=["kind", "query", "answers", "l1_error", "max_abs_error", "relative_l1",
                                        "noisy_l1_error"])
    summary = {"records": int(n_true), "queries_evaluated": int(len(frame)),
               "mean_relative_l1": float(frame["relative_l1"].mean()) if len(frame) else float("nan"),
               "max_abs_error": float(frame["max_abs_error"].max()) if len(frame) else float("nan")}
    return frame, summary, truths
