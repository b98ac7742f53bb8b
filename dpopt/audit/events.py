"""Candidate events over a release's output statistics, and the search for the most telling one.

The outputs of ``n`` runs on each of two neighbouring datasets are matrices ``X_a``, ``X_b``
(one row per run, one column per output statistic: released counts, answers, record
histograms). An *event* is a set of outputs; the audit wants the event whose probabilities
under the two datasets differ by the largest factor, measured by the lower bound on ε it
would certify (:func:`dpopt.audit.stats.epsilon_lower_bound`). As in StatDP (Ding et al., CCS
2018, Section 5) the candidates are simple and readable, and the best one is chosen on one set
of runs and tested on fresh ones:

* thresholds ``{x_j >= t}`` and ``{x_j <= t}`` on each statistic (at every observed value, or
  at quantiles when there are many);
* point events ``{x_j = v}`` for discrete statistics, and the set of values seen on one dataset
  only (when the statistic repeats its values: a value of a continuous statistic is seen once),
  the set taken from half the runs and counted on the other half;
* **exact-value** events ``{x_j · 2^k is an integer}`` and their complements: whether a value
  has bits below ``2^-k``. Noise drawn in floating point leaves the true answer's trace in the
  least significant bits (Mironov, CCS 2012); exact integer noise leaves none;
* the same thresholds on the total of each released answer table (:func:`table_totals`), which
  also join the scores below;
* thresholds on a linear score ``w · x`` that weighs the statistics by how much their means
  differ (a linear discriminant: the classifier-based attack of DP-Sniper, Bichsel et al.,
  S&P 2021, in its simplest form): the log-likelihood ratio of Gaussian noise;
* thresholds on a *clipped* score ``Σ_j sign(d_j) clip(x_j - c_j, -|d_j|/2, |d_j|/2) / s_j``
  (``d_j`` the difference of the means, ``c_j`` their midpoint, ``s_j`` the standard
  deviation): the log-likelihood ratio of Laplace noise, whose privacy loss on one answer is
  ``(|x - μ_b| - |x - μ_a|) / b``, a clipped linear function (Dwork and Roth, 2014, Thm 3.6's
  proof). Its tail is the event where every changed answer leans the same way, the event that
  attains the loss of a composition; a linear score on Laplace answers is dominated by the
  single largest draw instead. Statistics the neighbours do not change get a clip width near 0
  and drop out.

Each event is tried in both directions (``a`` more likely than ``b`` and the reverse).

**Choice by power, not by point estimate.** A candidate's *merit* is the lower bound its
frequencies would certify on the test's runs (:func:`projected_bound`: the search frequencies,
smoothed so that a count of 0 is not read as a probability of 0, scaled to ``n_test`` runs per
dataset), not the bound on the search's own runs: a frequent event
with a moderate ratio beats a rare one with a large ratio when the test could not confirm the
rare one. Ties (typically every merit 0: no evidence at the test's size, the census case) go
to the event whose test would detect the smallest excess over the claim
(:func:`dpopt.audit.stats.detectable_excess`, computed by the harness for the finalists; here
its monotone proxy, the favoured dataset's frequency, among events seen more often on the
favoured side), then to the larger observed ratio: a verdict of "no violation" then states the
most the runs could have detected, not the nothing of a rare event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from dpopt.audit.stats import epsilon_lower_bound

__all__ = ["Event", "Candidate", "rank", "search_events", "exact_disclosures", "linear_disclosures", "projected_bound",
           "scored", "table_totals", "GRID_BITS"]

#: Exponents ``k`` of the exact-value events ``x · 2^k ∈ Z``.
GRID_BITS = (0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 50, 51, 52, 53, 54, 56, 58, 60)
#: At most this many thresholds per statistic.
MAX_THRESHOLDS = 96
#: At most this many distinct values for point and set events.
MAX_POINTS = 64


@dataclass(frozen=True, eq=False)
class Event:
    """A set of outputs, defined on the statistics matrix.

    Attributes
    ----------
    kind : str
        ``"ge"``, ``"le"`` (threshold), ``"eq"`` (point), ``"in"`` (set of values),
        ``"grid"``/``"offgrid"`` (exact value on / off the grid ``2^-k``), ``"score_ge"``,
        ``"score_le"`` (threshold on the linear or, with ``clip``, the clipped score).
    feature : int
        Column of the statistic (-1 for the score).
    value : float
        Threshold, point, or grid exponent ``k``.
    values : tuple
        The set of an ``"in"`` event.
    weights : tuple or None
        ``(center, weights)`` of the linear score, or ``(center, weights, half_widths)`` of the
        clipped score ``Σ_j w_j clip(x_j - c_j, -h_j, h_j)`` (module notes).
    label : str
        What it is, in words (names the statistic).
    extend : ndarray or None
        ``G``: the event reads the statistics extended by the table totals ``X G``
        (:func:`table_totals`); ``feature`` and ``weights`` index the extended columns.
    """

    kind: str
    feature: int
    value: float = 0.0
    values: tuple = ()
    weights: tuple | None = field(default=None, repr=False)
    label: str = ""
    extend: np.ndarray | None = field(default=None, repr=False)

    def statistic(self, X: np.ndarray) -> np.ndarray:
        """The statistic the event thresholds (the column, or the linear score)."""
        X = _extended(np.asarray(X, dtype=np.float64), self.extend)
        if self.feature >= 0:
            return X[:, self.feature]
        center, w, *clip = (np.asarray(v) for v in self.weights)
        shifted = X - center
        if clip:
            shifted = np.clip(shifted, -clip[0], clip[0])
        return shifted @ w

    def hits(self, X: np.ndarray) -> np.ndarray:
        """Boolean: which rows (runs) fall in the event."""
        return self.contains(self.statistic(X))

    def contains(self, s: np.ndarray) -> np.ndarray:
        """Boolean: which values of the statistic lie in the event."""
        s = np.asarray(s, dtype=np.float64)
        if self.kind in ("ge", "score_ge"):
            return s >= self.value
        if self.kind in ("le", "score_le"):
            return s <= self.value
        if self.kind == "eq":
            return s == self.value
        if self.kind == "in":
            return np.isin(s, np.asarray(self.values, dtype=np.float64))
        on = _on_grid(s, int(self.value))
        return on if self.kind == "grid" else ~on

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "statistic": self.label, "value": float(self.value)}
        if self.values:
            out["values"] = [float(v) for v in self.values]
        return out


@dataclass(frozen=True, eq=False)
class Candidate:
    """An event with its counts on the search runs: ``larger`` is the dataset it favours."""

    event: Event
    larger: str
    k_a: int
    k_b: int
    n_a: int
    n_b: int
    bound: float
    merit: tuple = ()

    def describe(self) -> str:
        fa, fb = self.k_a / self.n_a, self.k_b / self.n_b
        return (f"{self.event.label}: P_a = {fa:.4g}, P_b = {fb:.4g} on the search runs "
                f"(more likely under {self.larger}); epsilon >= {self.bound:.3f}")


def _extended(X: np.ndarray, G: np.ndarray | None) -> np.ndarray:
    return X if G is None else np.hstack([X, X @ G])


_TABLE = re.compile(r"^(answer '.+' (?:count|noisy))\[")


def table_totals(names) -> tuple[np.ndarray | None, list[str]]:
    """``(G, labels)``: the total of each released answer table of two or more rows, as columns of
    ``X G`` (None when there is none).

    A table's total is what adding or removing a record moves most surely -- a marginal's total
    moves by one wherever the record falls, a cell only when the record falls in it. The totals
    join the statistics the events are built on (thresholds, and the scores, whose clipped form
    then adds a total's loss to a cell's).
    """
    groups: dict[str, list[int]] = {}
    for j, name in enumerate(names):
        m = _TABLE.match(name)
        if m:
            groups.setdefault(m.group(1), []).append(j)
    tables = [(label, cols) for label, cols in groups.items() if len(cols) > 1]
    if not tables:
        return None, []
    G = np.zeros((len(names), len(tables)))
    for t, (_, cols) in enumerate(tables):
        G[cols, t] = 1.0
    return G, [f"{label} total" for label, _ in tables]


def _on_grid(values: np.ndarray, k: int) -> np.ndarray:
    scaled = np.ldexp(values, k)  # exact: a power-of-two scaling
    with np.errstate(invalid="ignore"):
        return np.isfinite(scaled) & (scaled == np.floor(scaled))


def _thresholds(values: np.ndarray) -> np.ndarray:
    u = np.unique(values)
    if u.size <= MAX_THRESHOLDS:
        return u
    return np.unique(np.quantile(values, np.linspace(0, 1, MAX_THRESHOLDS), method="inverted_cdf"))


def _threshold_counts(sorted_a, sorted_b, t):
    ge_a = sorted_a.size - np.searchsorted(sorted_a, t, "left")
    ge_b = sorted_b.size - np.searchsorted(sorted_b, t, "left")
    le_a = np.searchsorted(sorted_a, t, "right")
    le_b = np.searchsorted(sorted_b, t, "right")
    return (ge_a, ge_b), (le_a, le_b)


def projected_bound(k_hi, n_hi, k_lo, n_lo, n_test, delta: float = 0.0, alpha: float = 0.05):
    """The lower bound the frequencies of ``k_hi`` hits in ``n_hi`` runs and ``k_lo`` in ``n_lo``
    would certify on ``n_test`` runs per dataset (:func:`~dpopt.audit.stats.epsilon_lower_bound`
    at the scaled counts, the Clopper–Pearson bounds read at real-valued counts): what a test of
    that size would show if the search's frequencies held. Vectorised.

    Both frequencies are *smoothed* first, ``(k + 1/2) / (n + 1)`` (the add-one-half estimate,
    the mean of the Jeffreys posterior ``Beta(k + 1/2, n - k + 1/2)``, Krichevsky and Trofimov,
    IEEE Trans. Inf. Theory 1981): an event never seen on one dataset's search runs is not
    projected as impossible there. Read raw, ``k_lo = 0`` projects to 0 hits on any number of
    test runs, so a handful of hits against none projects to a positive bound at a large enough
    ``n_test`` -- the census case, where the search chose values seen under one dataset only
    (a few chance hits among thousands of candidates) and its test then certified nothing.
    """
    k_hi = (np.asarray(k_hi, dtype=np.float64) + 0.5) * (n_test / (np.asarray(n_hi, dtype=np.float64) + 1.0))
    k_lo = (np.asarray(k_lo, dtype=np.float64) + 0.5) * (n_test / (np.asarray(n_lo, dtype=np.float64) + 1.0))
    return epsilon_lower_bound(k_hi, n_test, k_lo, n_test, delta, alpha)


def _merits(k_hi, n_hi, k_lo, n_lo, n_test, delta, alpha):
    """``(projected bound at n_test, power proxy, smoothed log ratio)`` for each candidate (module
    notes); the proxy is the favoured frequency where it exceeds the other's, else -1."""
    k_hi, k_lo = np.atleast_1d(np.asarray(k_hi, dtype=np.float64)), np.atleast_1d(np.asarray(k_lo, dtype=np.float64))
    near = np.atleast_1d(projected_bound(k_hi, n_hi, k_lo, n_lo, n_test, delta, alpha))
    power = np.where(k_hi / n_hi > k_lo / n_lo, k_hi / n_hi, -1.0)
    ratio = np.log((k_hi + 0.5) / (n_hi + 1)) - np.log((k_lo + 0.5) / (n_lo + 1))
    return near, power, ratio


def scored(event: Event, larger: str, k_a: int, k_b: int, n_a: int, n_b: int, n_test: int, delta: float,
           alpha: float) -> Candidate:
    """A candidate with its bound on these counts and its merit for a test of ``n_test`` runs."""
    hi, lo, n_hi, n_lo = (k_a, k_b, n_a, n_b) if larger == "a" else (k_b, k_a, n_b, n_a)
    bound = float(epsilon_lower_bound(hi, n_hi, lo, n_lo, delta, alpha))
    near, power, ratio = _merits(hi, n_hi, lo, n_lo, n_test, delta, alpha)
    return Candidate(event, larger, int(k_a), int(k_b), n_a, n_b, bound, (float(near[0]), float(power[0]),
                                                                         float(ratio[0])))


class _Collector:
    """Keeps the best candidates by merit (module notes), and as many again by power alone:
    scored in both directions, vectorised.

    The second list holds the events of largest favoured frequency among those seen more often
    on the favoured side. Among thousands of candidates, the best merits on the proposing runs
    are mostly chance (a rare event with a few hits against none); when they regress on fresh
    runs, the events that could still show an excess must be among the finalists.
    """

    def __init__(self, n_a, n_b, delta, alpha, keep, n_test):
        self.n_a, self.n_b, self.delta, self.alpha, self.keep = n_a, n_b, delta, alpha, keep
        self.n_test = n_test
        self.by_merit: list[Candidate] = []
        self.by_power: list[Candidate] = []

    @property
    def items(self) -> list[Candidate]:
        """The best by merit, then those of most power not among them."""
        first = set(map(id, self.by_merit))
        return self.by_merit + [c for c in self.by_power if id(c) not in first]

    def add(self, make_event, k_a, k_b):
        k_a = np.atleast_1d(np.asarray(k_a, dtype=np.int64))
        k_b = np.atleast_1d(np.asarray(k_b, dtype=np.int64))
        if k_a.size == 0:
            return
        for hi, lo, n_hi, n_lo, larger in ((k_a, k_b, self.n_a, self.n_b, "a"), (k_b, k_a, self.n_b, self.n_a, "b")):
            near, power, ratio = _merits(hi, n_hi, lo, n_lo, self.n_test, self.delta, self.alpha)
            by_merit = np.lexsort((-ratio, -power, -near))[: self.keep]
            by_power = np.lexsort((-ratio, -near, -power))[: self.keep]
            by_power = by_power[power[by_power] > 0]
            chosen = np.unique(np.concatenate([by_merit, by_power]))
            bounds = np.atleast_1d(epsilon_lower_bound(hi[chosen], n_hi, lo[chosen], n_lo, self.delta, self.alpha))
            made = {}
            for i, bound in zip(chosen, bounds):
                made[int(i)] = Candidate(make_event(int(i)), larger, int(k_a[i]), int(k_b[i]), self.n_a, self.n_b,
                                         float(bound), (float(near[i]), float(power[i]), float(ratio[i])))
            self.by_merit += [made[int(i)] for i in by_merit]
            self.by_power += [made[int(i)] for i in by_power]
        self.by_merit.sort(key=rank)
        del self.by_merit[self.keep:]
        self.by_power.sort(key=lambda c: (-c.merit[1], -c.merit[0], -c.merit[2]))
        del self.by_power[self.keep:]


def rank(c: Candidate) -> tuple:
    """Sort key: the larger merit first (module notes)."""
    return tuple(-v for v in c.merit)


def search_events(Xa: np.ndarray, Xb: np.ndarray, names, *, delta: float = 0.0, alpha: float = 0.05,
                  keep: int = 5, score: bool = True, n_test: int | None = None) -> list[Candidate]:
    """The ``keep`` candidate events of most merit on these runs, best first (module notes), then
    up to ``keep`` more of most power (the favoured frequency) not among them (:class:`_Collector`).

    ``n_test``: the runs per dataset of the test the events are chosen for (default: as many as
    these runs).
    """
    G, totals = table_totals(names)
    Xa = _extended(np.asarray(Xa, dtype=np.float64), G)
    Xb = _extended(np.asarray(Xb, dtype=np.float64), G)
    names = list(names) + totals
    out = _Collector(Xa.shape[0], Xb.shape[0], delta, alpha, keep, n_test or max(Xa.shape[0], Xb.shape[0]))
    for j in range(Xa.shape[1]):
        _add_column(out, j, Xa[:, j], Xb[:, j], names[j], extend=G if j >= len(names) - len(totals) else None)
    if score and Xa.shape[1] > 1:
        for weights, label in ((_discriminant(Xa, Xb), "linear score"), (_clipped(Xa, Xb), "clipped score")):
            if weights is not None:
                probe = Event("score_ge", -1, weights=weights)
                _add_column(out, -1, probe.statistic(Xa), probe.statistic(Xb), _score_label(weights, names, label),
                            weights, extend=G)
    return out.items


def _add_column(out: _Collector, j, va, vb, label, weights=None, extend=None) -> None:
    sa, sb = np.sort(va), np.sort(vb)
    t = _thresholds(np.concatenate([va, vb]))
    (ge_a, ge_b), (le_a, le_b) = _threshold_counts(sa, sb, t)
    ge, le = ("ge", "le") if j >= 0 else ("score_ge", "score_le")
    out.add(lambda i: Event(ge, j, float(t[i]), weights=weights, label=f"{label} >= {t[i]:.6g}", extend=extend),
            ge_a, ge_b)
    out.add(lambda i: Event(le, j, float(t[i]), weights=weights, label=f"{label} <= {t[i]:.6g}", extend=extend),
            le_a, le_b)
    if j < 0 or extend is not None:
        return  # a score or a table's total: thresholds only
    u, counts = np.unique(np.concatenate([va, vb]), return_counts=True)
    if u.size <= MAX_POINTS:
        ka = np.array([np.count_nonzero(va == v) for v in u])
        kb = counts - ka
        out.add(lambda i: Event("eq", j, float(u[i]), label=f"{label} = {u[i]:.6g}"), ka, kb)
    # The set of values seen under one dataset only is defined on the first half of these runs and
    # counted on the second (scaled to all the runs): counted on the runs that defined it, it has no
    # hit under the other dataset by construction, and its merit would be pure selection bias.
    ha, hb = va.size // 2, vb.size // 2
    if u.size > min(4 * MAX_POINTS, (va.size + vb.size) // 8) or min(ha, hb) < 2:
        only_a = only_b = np.zeros(0)  # a continuous statistic: a value seen once says nothing
    else:
        only_a, only_b = np.setdiff1d(np.unique(va[:ha]), vb[:hb]), np.setdiff1d(np.unique(vb[:hb]), va[:ha])
    for only, side in ((only_a, "a"), (only_b, "b")):
        if only.size:
            values = tuple(float(v) for v in only)
            k_a = round(np.count_nonzero(np.isin(va[ha:], only)) * va.size / (va.size - ha))
            k_b = round(np.count_nonzero(np.isin(vb[hb:], only)) * vb.size / (vb.size - hb))
            out.add(lambda i, values=values, side=side: Event(
                "in", j, values=values, label=f"{label} takes a value seen only under {side} on the search runs "
                                              f"({len(values)} value{'s' if len(values) > 1 else ''})"), [k_a], [k_b])
    if np.all(np.abs(u) < 2**52) and np.all(u == np.round(u)):
        return  # integer outputs carry no low-order bits to test
    bits = np.asarray(GRID_BITS)
    on_a = np.array([np.count_nonzero(_on_grid(va, k)) for k in bits])
    on_b = np.array([np.count_nonzero(_on_grid(vb, k)) for k in bits])
    out.add(lambda i: Event("grid", j, float(bits[i]), label=f"{label} is a multiple of 2^-{bits[i]} (exact value)"),
            on_a, on_b)
    out.add(lambda i: Event("offgrid", j, float(bits[i]),
                            label=f"{label} has bits below 2^-{bits[i]} (exact value)"),
            va.size - on_a, vb.size - on_b)


def _discriminant(Xa: np.ndarray, Xb: np.ndarray):
    """``(center, w)``: weights ``(mean_a - mean_b) / variance`` of each varying statistic (or None)."""
    ma, mb = Xa.mean(axis=0), Xb.mean(axis=0)
    var = 0.5 * (Xa.var(axis=0) + Xb.var(axis=0))
    scale = np.maximum(np.abs(ma), np.abs(mb)) + 1.0
    varying = var > (1e-12 * scale) ** 2
    if varying.sum() < 2:
        return None
    w = np.where(varying, (ma - mb) / np.where(varying, var, 1.0), 0.0)
    if not np.any(w):
        return None
    center = 0.5 * (ma + mb)
    return tuple(center.tolist()), tuple(w.tolist())


def _clipped(Xa: np.ndarray, Xb: np.ndarray):
    """``(center, w, h)`` of the clipped score (module notes): ``w = sign(d) / s``, ``h = |d| / 2``."""
    ma, mb = Xa.mean(axis=0), Xb.mean(axis=0)
    sd = np.sqrt(0.5 * (Xa.var(axis=0) + Xb.var(axis=0)))
    scale = np.maximum(np.abs(ma), np.abs(mb)) + 1.0
    varying = sd > 1e-12 * scale
    d = ma - mb
    if varying.sum() < 2 or not np.any(d[varying]):
        return None
    w = np.where(varying, np.sign(d) / np.where(varying, sd, 1.0), 0.0)
    return tuple((0.5 * (ma + mb)).tolist()), tuple(w.tolist()), tuple((0.5 * np.abs(d)).tolist())


def _score_label(weights, names, kind: str = "linear score") -> str:
    _, w, *clip = weights
    w = np.asarray(w)
    size = np.abs(w) * (np.asarray(clip[0]) if clip else 1.0)  # a clipped term weighs at most |w| h
    top = np.argsort(-size)[:3]
    terms = " ".join(f"{'+' if w[i] >= 0 else '-'} {abs(w[i]):.3g}·[{names[i]}]" for i in top if size[i])
    more = f" + {np.count_nonzero(size) - len(top)} more" if np.count_nonzero(size) > len(top) else ""
    return f"{kind} ({terms.lstrip('+ ')}{more})"


def exact_disclosures(Xa: np.ndarray, Xb: np.ndarray, names) -> list[str]:
    """Statistics that take one value on every run of ``a`` and another on every run of ``b``.

    Such a statistic is published exactly: no noise hides which dataset was used. Values equal
    to within 1e-9 (relative) count as one value, so a total computed in floating point is
    caught too. When no single statistic is, linear combinations of them are tried
    (:func:`linear_disclosures`).
    """
    Xa = np.asarray(Xa, dtype=np.float64)
    Xb = np.asarray(Xb, dtype=np.float64)
    if Xa.shape[0] < 2 or Xb.shape[0] < 2:
        return []
    lo_a, hi_a, lo_b, hi_b = Xa.min(0), Xa.max(0), Xb.min(0), Xb.max(0)
    scale = np.maximum(1.0, np.maximum(np.abs(hi_a), np.abs(hi_b)))
    tight = (hi_a - lo_a <= 1e-9 * scale) & (hi_b - lo_b <= 1e-9 * scale)
    apart = np.abs(hi_a - hi_b) > 1e-6 * scale
    found = [names[j] for j in np.flatnonzero(tight & apart)]
    return found if found else linear_disclosures(Xa, Xb, names)


#: A linear combination counts as published exactly when its spread on each dataset's runs is at
#: most ``LINEAR_TIGHT`` and its two values differ by more than ``LINEAR_APART`` (both relative to
#: the largest statistic, at least 1).
LINEAR_TIGHT, LINEAR_APART = 1e-7, 1e-4


def linear_disclosures(Xa: np.ndarray, Xb: np.ndarray, names) -> list[str]:
    """Linear combinations ``v · x`` of the statistics published exactly: one value on every run
    of ``a``, another on every run of ``b``.

    A release that is linear in its noisy answers (a least-squares fit, a published noisy
    answer, a polynomial evaluation) shows an answer released without noise as such a
    combination even when no single statistic is exact (the unnoised answer is spread over
    the cells of a fit). The directions ``v`` are found on the first half of each dataset's runs
    (the null space of the runs' spread about their own means, by SVD) and kept only when the
    second half confirms them: a direction that is constant merely because there are fewer runs
    than statistics is not constant on fresh runs. Needs more runs in each half than statistics
    (else []).
    """
    na, nb = Xa.shape[0] // 2, Xb.shape[0] // 2
    if min(na, nb) < 2 or na + nb - 2 <= Xa.shape[1]:
        return []
    scale = max(1.0, float(np.abs(Xa).max(initial=0.0)), float(np.abs(Xb).max(initial=0.0)))
    spread = np.concatenate([Xa[:na] - Xa[:na].mean(0), Xb[:nb] - Xb[:nb].mean(0)]) / scale
    _, sv, vt = np.linalg.svd(spread, full_matrices=True)
    sv = np.concatenate([sv, np.zeros(vt.shape[0] - sv.size)])
    null = vt[sv <= LINEAR_TIGHT * max(1.0, sv.max(initial=0.0))]
    if null.size == 0:
        return []
    ya, yb = Xa @ null.T / scale, Xb @ null.T / scale  # every run, both halves
    tight = (np.ptp(ya, axis=0) <= LINEAR_TIGHT) & (np.ptp(yb, axis=0) <= LINEAR_TIGHT)
    apart = np.abs(ya.mean(0) - yb.mean(0)) > LINEAR_APART
    out = []
    for v in null[tight & apart][:3]:
        top = np.argsort(-np.abs(v))[:3]
        terms = " ".join(f"{'+' if v[i] >= 0 else '-'} {abs(v[i]):.3g}·[{names[i]}]" for i in top if abs(v[i]) > 1e-9)
        more = np.count_nonzero(np.abs(v) > 1e-9) - len(top)
        out.append(f"the linear combination {terms.lstrip('+ ')}{f' + {more} more' if more > 0 else ''}")
    return out
