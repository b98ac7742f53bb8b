"""Neighbouring datasets over a tiny domain, chosen to stress the algorithm.

Datasets are histograms over the cells of a tiny domain (a record is a cell). Two relations:

``add_remove`` (dpopt's neighbours: adding or removing one record)
    Every pair ``(D, D + one record)`` with ``|D| < max_records`` (the worst-case search over
    all small datasets), plus *adversarial* pairs built from the algorithm's declared
    sensitivity structure: the record goes into a cell whose column of a planned query attains
    the query's sensitivity (the cell one record moves most), on an empty dataset, on one record
    in every cell, and on a heap of records in that cell.

``move`` (one record moved, keeping published-exact statistics)
    ``(D, D - r + c)``: the record count stays the same, and so does every statistic the
    release publishes exactly (an invariant ``Q x`` stays equal when the columns ``Q[:, r]``
    and ``Q[:, c]`` are equal). Such datasets are two add/remove steps apart, so they are
    audited against the group guarantee (:meth:`dpopt.audit.claims.Claim.group`).

When there are more pairs than the audit can screen, the adversarial ones come first and the
rest are taken in order of size, a seeded sample of them when even those are too many.

A bug that leaks one answer (released without noise) shows only between neighbours that change
that answer, and on a domain of many cells a few screened pairs change few of them. But an
exact disclosure shows in two runs per dataset, so the harness first *sweeps* pairs that
together change every cell (:func:`covering_pairs`) with a few runs each.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from dpopt.model.domain import Domain

__all__ = ["Pair", "add_remove_pairs", "move_pairs", "hot_cells", "cell_labels", "limit_pairs", "covering_pairs"]


@dataclass(frozen=True)
class Pair:
    """Two neighbouring datasets as histograms over the cells, and why the pair was chosen."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    why: str

    def describe(self, labels) -> str:
        return f"{_records(self.a, labels)} vs {_records(self.b, labels)}"

    def to_dict(self, labels) -> dict:
        return {"a": _records(self.a, labels), "b": _records(self.b, labels), "why": self.why,
                "records_a": int(sum(self.a)), "records_b": int(sum(self.b))}


def cell_labels(domain: Domain) -> list[str]:
    """``a0=0, a1=1``-style label of every cell, in cell order."""
    codes = domain.unravel(np.arange(domain.size))
    labels = [domain.labels_of(a) for a in domain.attrs]
    return [", ".join(f"{a}={labels[j][c]}" for j, (a, c) in enumerate(zip(domain.attrs, row))) for row in codes]


def _records(h, labels) -> str:
    parts = [f"{k}×({labels[c]})" if k > 1 else f"({labels[c]})" for c, k in enumerate(h) if k]
    return "{" + ", ".join(parts) + "}" if parts else "{} (no records)"


def _hist(m: int, cells) -> tuple[int, ...]:
    h = np.zeros(m, dtype=np.int64)
    np.add.at(h, np.asarray(list(cells), dtype=np.int64), 1)
    return tuple(int(v) for v in h)


def _small_datasets(m: int, max_size: int, allowed):
    for size in range(max_size + 1):
        for cells in itertools.combinations_with_replacement(allowed, size):
            yield _hist(m, cells)


def hot_cells(domain: Domain, steps) -> tuple[list[int], list[str]]:
    """Cells whose column attains the sensitivity of some planned query, and what each is for.

    ``steps`` are the plan's :class:`~dpopt.algorithms.base.PlannedMeasure`; the L1 column
    norms decide for Laplace steps, the squared L2 norms for Gaussian ones. Steps whose query is
    chosen during the run (None), or is over another domain (the binary encoding of the
    polynomial release, a unit's characteristics in a top-down release), say nothing: their
    columns are not the audit domain's cells. Every cell when no step names one, the first and
    the last first, then inwards (0, m-1, 1, m-2, ...): the adversarial pairs built from the first
    few then put records in cells that differ in every attribute, not in neighbouring cells that
    share all but the last.
    """
    cells, why = [], []
    for step in steps:
        query, law = getattr(step, "query", None), getattr(step, "law", None)
        if query is None or getattr(query, "domain", None) != domain:
            continue
        p = 2 if law is not None and law.mechanism == "gaussian" else 1
        powers = np.broadcast_to(np.asarray(query.column_norm_powers(p), dtype=np.float64), (domain.size,))
        worst = np.flatnonzero(powers >= powers.max() * (1 - 1e-12))
        for c in worst:
            if c not in cells:
                cells.append(int(c))
                why.append(f"its column attains the L{p} sensitivity of {getattr(step, 'label', query.name)!r}")
    if not cells:  # first and last cell first: records that differ in every attribute (for binary attributes,
        # the last cell satisfies every monotone conjunction, the first none), then inwards
        order = np.stack([np.arange(domain.size), np.arange(domain.size)[::-1]], axis=1).ravel()[: domain.size]
        return [int(c) for c in order], ["every cell (no planned query is fixed in advance)"] * domain.size
    return cells, why


def add_remove_pairs(domain: Domain, max_records: int, hot: list[int], hot_why: list[str],
                     allowed: list[int] | None = None) -> list[Pair]:
    """Adversarial pairs first, then every ``(D, D + record)`` with ``|D| < max_records``.

    Records go only into ``allowed`` cells (default all: cells a public structural zero rules out
    hold no record of any dataset).
    """
    m = domain.size
    allowed = list(range(m)) if allowed is None else list(allowed)
    pairs: list[Pair] = []
    seen = set()

    def add(a, b, why):
        if (a, b) not in seen and (b, a) not in seen:
            seen.add((a, b))
            pairs.append(Pair(a, b, why))

    empty = (0,) * m
    heap = max(max_records, 2)
    for c, why in zip(hot, hot_why):
        if c not in allowed:
            continue
        add(empty, _hist(m, [c]), f"adversarial: one record alone in a cell ({why})")
        spread = _hist(m, allowed)
        add(spread, tuple(v + (i == c) for i, v in enumerate(spread)),
            f"adversarial: one more record beside one in every cell ({why})")
        add(_hist(m, [c] * (heap - 1)), _hist(m, [c] * heap), f"adversarial: a heap of records in one cell ({why})")
    for base in _small_datasets(m, max_records - 1, allowed):
        for c in allowed:
            add(base, tuple(v + (i == c) for i, v in enumerate(base)),
                f"all datasets of at most {max_records} records")
    return pairs


def move_pairs(domain: Domain, max_records: int, keep, hot: list[int], allowed: list[int] | None = None) -> list[Pair]:
    """Pairs ``(D, D - r + c)`` with ``1 <= |D| <= max_records`` whose published-exact statistics agree.

    ``keep(r, c)`` says whether moving a record from cell ``r`` to cell ``c`` keeps them; records
    go only into ``allowed`` cells.
    """
    m = domain.size
    allowed = list(range(m)) if allowed is None else list(allowed)
    pairs, seen = [], set()
    order = [c for c in dict.fromkeys(list(hot) + allowed) if c in allowed]
    for size in range(1, max(max_records, 1) + 1):
        for base in _small_datasets(m, size, allowed):
            if sum(base) != size:
                continue
            for r in (i for i in range(m) if base[i]):
                for c in order:
                    if c == r or not keep(r, c):
                        continue
                    b = tuple(v - (i == r) + (i == c) for i, v in enumerate(base))
                    if (b, base) in seen:
                        continue
                    seen.add((base, b))
                    pairs.append(Pair(base, b, f"one record moved, keeping the record count and every published-"
                                               f"exact statistic ({size} record{'s' if size > 1 else ''})"))
    return pairs


def limit_pairs(pairs: list[Pair], max_pairs: int, seed: int) -> tuple[list[Pair], str]:
    """At most ``max_pairs``: adversarial ones first, then a seeded sample of the rest."""
    if len(pairs) <= max_pairs:
        return pairs, f"all {len(pairs)} candidate pairs"
    first = [p for p in pairs if p.why.startswith("adversarial")][:max_pairs]
    rest = [p for p in pairs if not p.why.startswith("adversarial")]
    room = max_pairs - len(first)
    gen = np.random.default_rng(seed)  # audit design, not privacy noise
    picked = sorted(gen.choice(len(rest), size=min(room, len(rest)), replace=False)) if room > 0 else []
    return first + [rest[i] for i in picked], (f"{max_pairs} of {len(pairs)} candidate pairs "
                                               f"({len(first)} adversarial, {len(picked)} sampled)")


def covering_pairs(pairs: list[Pair]) -> list[Pair]:
    """Pairs that together change every cell some pair changes: in order (the adversarial pairs
    come first in the harness's lists), each pair that changes a cell no earlier chosen pair did."""
    chosen, covered = [], set()
    for p in pairs:
        changed = _changed(p)
        if not changed <= covered:
            chosen.append(p)
            covered |= changed
    return chosen


def _changed(p: Pair) -> set:
    return {i for i, (x, y) in enumerate(zip(p.a, p.b)) if x != y}
