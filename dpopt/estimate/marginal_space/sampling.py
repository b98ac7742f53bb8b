"""Synthetic records from a marginal-space estimate: a Bayesian network drawn with controlled rounding.

The estimate holds consistent marginals, not a table; records need a joint law. Here it is a
Bayesian network fitted to the estimate alone (post-processing), in the manner of PrivBayes
(Zhang, Cormode, Procopiuc, Srivastava, Xiao, TODS 2017) and of Chow and Liu (1968) for
one parent:

1. **Structure.** Every *family* — a child and its parents — is an attribute set inside one
   of the estimate's cliques (so its marginal is estimated, and consistent with every other).
   Greedily, starting from a root, the next attribute placed is the child of the family, among
   those whose parents are all placed, with the largest mutual information
   ``I(child; parents)`` computed from the estimated family marginal (at most
   ``max_parents`` parents). The roots tried are the parents of the ``RESTARTS`` strongest
   one-parent families; the network kept has the largest total ``sum I(child; parents)``, which
   is the log-likelihood of the estimate's law under the network up to a constant (Chow and Liu
   1968; the objective of PrivBayes). When the estimate holds pairs only, a tree would be all
   the network could be; so every triple whose three pairs are estimated is a candidate family
   too, its table the maximum-entropy completion of those three pair marginals (iterative
   proportional fitting; Deming and Stephan 1940, Darroch and Ratcliff 1972): two parents, and
   every pair inside the family kept (at most ``MAX_COMPLETED_TRIPLES`` triples).

   What the records lose against the estimate (issue 27, d = 27 binary attributes, all 2,925
   triples, zCDP rho = 1/2, n = 50,000; mean L1/n against the data): estimate 0.0027, records
   0.0102 from one root, 0.0096 from 8; 500,000 records instead of 50,000 (one root): 0.0091; the true
   network's structure with the estimate's conditionals (an oracle): 0.0079. So most of the gap
   is the sampling noise of ``n`` records on the marginals that are not families (about
   ``sum_cells sqrt(2 p (1 - p) / (pi n))``, 0.009 for a triple at n = 50,000), the rest the
   greedy structure. With an estimate of pairs only (d = 27, all 351 pairs, same budget) the
   records were 0.0158 against the estimate's 0.0006 with one-parent families; with the
   completed triples, 0.0041 (d = 100: 0.0065 -> 0.0042, 9 CPU-s for 161,700 triples).
2. **Conditionals.** ``P(child | parents)`` is the estimated family marginal, normalised per
   parent configuration (a configuration with no mass gets the child's own marginal).
3. **Records by controlled rounding along the network.** The root's values are allocated to
   the ``n`` records by systematic sampling of ``n P(root)`` (each count the floor or ceiling
   of its expectation, unbiased); then for each child, the records are grouped by their
   parents' values and each group of ``m_g`` records receives the counts ``m_g P(child | g)``
   rounded the same way (floor or ceiling, summing to ``m_g``), assigned in a random order
   within the group. So every family's counts in the records are within one record of
   ``(records with those parents) x P(child | parents)``, and the records follow the network
   exactly in expectation.

An estimate solved as a table (small domains) is sampled from the table itself: its cell counts
are the floor or ceiling of ``n x / total`` by the same systematic rounding. The network carries
dependence between attributes through their common neighbours, which the estimate's independence
prior for unmeasured marginals does not (see :mod:`~dpopt.estimate.marginal_space.estimator`).

Randomness is the caller's: ``uniforms`` (an array of independent uniforms on [0, 1)) or
``rng`` (a :class:`~dpopt.privacy.randomness.RandomSource` or a ``numpy`` Generator) passed in;
this package draws none. Records from a private estimate are post-processing: no privacy cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpopt.errors import ParameterError, QueryError
from dpopt.estimate.marginal_space.layout import SetFamily

__all__ = ["NetworkModel", "fit_network", "synthetic_records", "uniforms_needed", "product_records",
           "controlled_counts"]

#: Largest table (cells) of one family's conditional probabilities.
MAX_FAMILY_CELLS = 2**22
#: Largest number of triples completed from pairs by maximum entropy (step 1).
MAX_COMPLETED_TRIPLES = 200_000
#: Sweeps of iterative proportional fitting for a completed triple.
IPF_SWEEPS = 30
#: Roots the structure search starts from (step 1; the best network by total mutual information is kept).
RESTARTS = 8


@dataclass
class NetworkModel:
    """A Bayesian network over the domain: families in sampling order and their conditionals.

    Attributes
    ----------
    domain : Domain
    order : list of int
        Attribute axes in the order they are drawn.
    parents : dict of int to tuple of int
        Parent axes of each attribute (sorted).
    conditionals : dict of int to ndarray
        ``P(child | parents)``: shape ``(parent configurations, child values)``, parent
        configurations in C order over the sorted parent axes.
    scores : dict of int to float
        ``I(child; parents)`` of each family (nats), from the estimate.
    """

    domain: object
    order: list
    parents: dict
    conditionals: dict
    scores: dict

    def families(self) -> list[tuple[str, ...]]:
        """Each family (child then parents) as attribute names, in sampling order."""
        names = self.domain.attrs
        return [(names[c],) + tuple(names[p] for p in self.parents[c]) for c in self.order]

    def sample_codes(self, n: int, draw) -> np.ndarray:
        """Codes ``(n, d)`` of ``n`` records (module notes, step 3); ``draw(m)`` returns ``m`` uniforms."""
        sizes = np.asarray(self.domain.sizes, dtype=np.int64)
        codes = np.zeros((n, len(sizes)), dtype=np.int64)
        for child in self.order:
            parents = self.parents[child]
            table = self.conditionals[child]
            if parents:
                group = np.ravel_multi_index(tuple(codes[:, list(parents)].T), tuple(sizes[list(parents)]))
            else:
                group = np.zeros(n, dtype=np.int64)
            counts = np.bincount(group, minlength=table.shape[0])
            alloc = controlled_counts(counts[:, None] * table, counts, draw(table.shape[0]))
            order = np.lexsort((draw(n), group))  # records by group, in a random order within each group
            values = np.repeat(np.tile(np.arange(table.shape[1]), table.shape[0]), alloc.ravel())
            codes[order, child] = values
        return codes


def controlled_counts(expected: np.ndarray, totals: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Integer rows summing to ``totals``, each entry the floor or ceiling of ``expected`` (rows
    summing to ``totals``), by systematic sampling of the fractional parts with one uniform per
    row: unbiased (``E[out] = expected``), all rows at once."""
    expected = np.maximum(np.asarray(expected, dtype=np.float64), 0.0)
    totals = np.asarray(totals, dtype=np.int64)
    base = np.floor(expected)
    short = totals - base.sum(axis=1).astype(np.int64)  # how many entries of each row round up
    frac = expected - base
    sums = frac.sum(axis=1)
    scale = np.divide(short, sums, out=np.zeros_like(sums), where=sums > 0)  # fix floating-point drift
    cum = np.cumsum(frac * scale[:, None], axis=1)
    cum[:, -1] = short
    u = np.asarray(uniforms, dtype=np.float64)[:, None]
    hits = np.floor(cum - u) - np.floor(np.concatenate([np.zeros((len(cum), 1)), cum[:, :-1]], axis=1) - u)
    out = base.astype(np.int64) + hits.astype(np.int64)
    bad = short < 0
    if bad.any():  # cannot happen for rows of non-negative expectations summing to their totals
        raise QueryError("controlled rounding: a row's expectations exceed its total")
    return out


def fit_network(estimate, *, max_parents: int | None = None, restarts: int = RESTARTS) -> NetworkModel:
    """The network of the module notes from a :class:`MarginalEstimate` (post-processing only).

    ``restarts``: how many roots the greedy structure search starts from (the parents of the
    strongest one-parent families, strongest first); the network of largest total mutual
    information is kept.
    """
    index, domain = estimate.index, estimate.domain
    sizes = np.asarray(domain.sizes, dtype=np.int64)
    d = len(domain)
    largest = max((len(c) for c in estimate.cliques), default=1)
    max_parents_given = max_parents
    max_parents = largest - 1 if max_parents is None else int(max_parents)
    if max_parents < 0:
        raise ParameterError(f"max_parents must be >= 0, got {max_parents}")
    # Candidate families: every residual set of 2 .. max_parents + 1 attributes (all subsets of cliques).
    families = [axes for axes in index.set_axes
                if 2 <= len(axes) <= max_parents + 1 and np.prod(sizes[list(axes)]) <= MAX_FAMILY_CELLS]
    fam = SetFamily(index, families) if families else None
    flat = fam.expand(estimate.residuals) if fam else np.zeros(0)
    child_of, parents_of, score_of = [], [], []
    if fam:
        for g in fam.groups:
            probs = np.maximum(fam.view(flat, g), 0.0)
            mass = probs.reshape(len(g.axes), -1).sum(axis=1)
            probs = probs / np.where(mass > 0, mass, 1.0).reshape((-1,) + (1,) * len(g.sizes))
            for j in range(len(g.sizes)):
                child_of.append(g.axes[:, j])
                parents_of.append(np.delete(g.axes, j, axis=1))
                score_of.append(_mutual_information(probs, j))
    completed: dict[tuple, np.ndarray] = {}
    if largest == 2 and (max_parents_given is None or max_parents_given >= 2):
        completed = _completed_triples(estimate, index, sizes)
        for axes, probs in _batches(completed, sizes):
            for j in range(3):
                child_of.append(axes[:, j])
                parents_of.append(np.delete(axes, j, axis=1))
                score_of.append(_mutual_information(probs, j))
    # Flatten the candidates (padded parent arrays, -1 for "none") for vectorised filtering.
    if child_of:
        width = max(p.shape[1] for p in parents_of)
        child = np.concatenate(child_of)
        pad = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-1) for p in parents_of])
        score = np.concatenate(score_of)
        nparents = (pad >= 0).sum(axis=1)
        # Roots to try: the parents of the strongest one-parent families (module notes, step 1).
        single = np.flatnonzero(nparents == 1)
        ranked = pad[single[np.argsort(-score[single], kind="stable")], 0] if single.size else np.zeros(1, np.int64)
        roots = list(dict.fromkeys(int(r) for r in ranked))[:max(int(restarts), 1)]
    else:
        child = pad = score = np.zeros(0, dtype=np.int64)
        roots = [0]
    # The network of largest total I(child; parents): the largest likelihood of the estimate's
    # law among networks with these families (Chow and Liu 1968; PrivBayes' objective).
    best = max((_greedy(root, child, pad, score, d) for root in roots), key=lambda g: g[3])
    order, parents, scores, _ = best
    conditionals = {}
    for c in order:
        family = tuple(sorted((c,) + parents[c]))
        table = completed[family] if family in completed else \
            np.maximum(estimate.marginal([domain.attrs[a] for a in family]), 0.0)
        table = table.reshape([int(sizes[a]) for a in family])
        table = np.moveaxis(table, family.index(c), -1).reshape(-1, int(sizes[c]))
        mass = table.sum(axis=1, keepdims=True)
        own = np.maximum(estimate.marginal([domain.attrs[c]]), 0.0)
        own = own / own.sum() if own.sum() > 0 else np.full(own.size, 1.0 / own.size)
        conditionals[c] = np.where(mass > 0, table / np.where(mass > 0, mass, 1.0), own[None, :])
    return NetworkModel(domain, order, parents, conditionals, scores)


def _completed_triples(estimate, index, sizes) -> dict:
    """Module notes, step 1 for an estimate of pairs: the maximum-entropy table of every triple
    whose three pairs are estimated (iterative proportional fitting of the three pair marginals,
    Deming and Stephan 1940; Darroch and Ratcliff 1972), as probabilities, keyed by sorted axes.
    None beyond ``MAX_COMPLETED_TRIPLES`` triples or ``MAX_FAMILY_CELLS`` cells."""
    pairs = {tuple(a) for a in index.set_axes if len(a) == 2}
    d = len(sizes)
    linked = np.zeros((d, d), dtype=bool)
    for a, b in pairs:
        linked[a, b] = linked[b, a] = True
    upper = np.triu(linked, 1)
    found, count = [], 0
    for i in range(d):  # one attribute at a time (a d x d slice), stopping past the cap
        j, k = np.nonzero(upper[i][:, None] & upper[i][None, :] & upper)
        count += j.size
        if count > MAX_COMPLETED_TRIPLES:
            return {}
        found.append(np.stack([np.full(j.size, i), j, k], axis=1))
    triples = np.concatenate(found) if found else np.zeros((0, 3), dtype=np.int64)
    triples = triples[np.prod(sizes[triples], axis=1) <= MAX_FAMILY_CELLS]
    if not len(triples):
        return {}
    names = estimate.domain.attrs
    wanted = sorted(pairs)
    tables = estimate.marginals([[names[a], names[b]] for a, b in wanted])
    pair_law = {}
    for (a, b), t in zip(wanted, tables.values()):
        t = np.maximum(np.asarray(t, dtype=np.float64), 0.0).reshape(int(sizes[a]), int(sizes[b]))
        pair_law[(a, b)] = t / t.sum() if t.sum() > 0 else np.full(t.shape, 1.0 / t.size)
    out = {}
    shapes = sizes[triples]
    for shape in np.unique(shapes, axis=0):
        rows = triples[(shapes == shape).all(axis=1)]
        ab = np.stack([pair_law[(a, b)] for a, b, _ in rows])
        ac = np.stack([pair_law[(a, c)] for a, _, c in rows])
        bc = np.stack([pair_law[(b, c)] for _, b, c in rows])
        p = np.full((len(rows),) + tuple(int(x) for x in shape), 1.0 / np.prod(shape))
        for _ in range(IPF_SWEEPS):
            p *= _ratio(ab, p.sum(axis=3))[:, :, :, None]
            p *= _ratio(ac, p.sum(axis=2))[:, :, None, :]
            p *= _ratio(bc, p.sum(axis=1))[:, None, :, :]
        for r, t in zip(rows, p):
            out[tuple(int(x) for x in r)] = t
    return out


def _ratio(target, current):
    return np.divide(target, current, out=np.zeros_like(target), where=current > 0)


def _batches(tables: dict, sizes):
    """``(axes (M, 3), probabilities (M, n1, n2, n3))`` of the completed triples, by shape."""
    keys = list(tables)
    if not keys:
        return []
    shapes = [tables[k].shape for k in keys]
    out = []
    for shape in dict.fromkeys(shapes):
        members = [k for k, s in zip(keys, shapes) if s == shape]
        out.append((np.asarray(members, dtype=np.int64), np.stack([tables[k] for k in members])))
    return out


def _greedy(root, child, pad, score, d):
    """Step 1 of the module notes from ``root``: ``(order, parents, scores, total score)``."""
    placed = np.zeros(d, dtype=bool)
    order: list[int] = []
    parents: dict[int, tuple[int, ...]] = {}
    scores: dict[int, float] = {}
    _place(root, (), 0.0, placed, order, parents, scores)
    while len(order) < d:
        if child.size:
            parents_ok = np.where(pad >= 0, placed[np.maximum(pad, 0)], True).all(axis=1)
            valid = parents_ok & ~placed[child]
        else:
            valid = np.zeros(0, dtype=bool)
        if valid.any():
            best = np.flatnonzero(valid)[np.argmax(score[valid])]
            c = int(child[best])
            _place(c, tuple(int(p) for p in pad[best] if p >= 0), float(score[best]), placed, order, parents, scores)
        else:  # an attribute in no family with placed parents: independent
            c = int(np.flatnonzero(~placed)[0])
            _place(c, (), 0.0, placed, order, parents, scores)
    return order, parents, scores, float(sum(scores.values()))


def _place(c, parents, score, placed, order, parents_of, scores) -> None:
    placed[c] = True
    order.append(c)
    parents_of[c] = tuple(sorted(parents))
    scores[c] = score


def _mutual_information(probs: np.ndarray, j: int) -> np.ndarray:
    """``I(x_j; other axes)`` of each batch row of probability tables ``(M, n_1, ..., n_k)``."""
    axis = 1 + j
    child = probs.sum(axis=tuple(a for a in range(1, probs.ndim) if a != axis), keepdims=True)
    rest = probs.sum(axis=axis, keepdims=True)
    expected = child * rest
    ratio = np.divide(probs, expected, out=np.ones_like(probs), where=(probs > 0) & (expected > 0))
    return (probs * np.log(ratio)).reshape(len(probs), -1).sum(axis=1)


def uniforms_needed(model: NetworkModel, n: int) -> int:
    """How many uniforms :func:`synthetic_records` draws for ``n`` records from ``model``."""
    return int(sum(n + model.conditionals[c].shape[0] for c in model.order))


def synthetic_records(estimate, n: int | None = None, *, uniforms=None, rng=None, max_parents: int | None = None,
                      model: NetworkModel | None = None) -> np.ndarray:
    """Codes ``(n, d)`` of ``n`` records (default: the estimate's total, rounded) from the network
    fitted to ``estimate`` (the release layer labels them).

    Parameters
    ----------
    estimate : MarginalEstimate
        A certified estimate (``success``): an uncertified one is refused.
    n : int, optional
    uniforms : ndarray, optional
        Independent uniforms on [0, 1), at least :func:`uniforms_needed` of them.
    rng : RandomSource or numpy Generator, optional
        Where to draw the uniforms instead (exactly one of ``uniforms`` and ``rng``).
    max_parents : int, optional
        Largest parent set (default: the largest clique's size minus one).
    model : NetworkModel, optional
        A network already fitted (:func:`fit_network`).
    """
    if not estimate.get("success", False):
        raise QueryError(f"the estimate is not certified (status {estimate.status.name}): no records from it")
    if (uniforms is None) == (rng is None):
        raise ParameterError("give exactly one of uniforms= (an array of uniforms on [0, 1)) and rng=")
    n = int(round(estimate.total)) if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ParameterError(f"n must be a non-negative integer, got {n!r}")
    table = estimate.get("table")
    if table is not None and model is None:  # solved as a table: controlled rounding of the table itself
        x = np.maximum(np.asarray(table, dtype=np.float64), 0.0)
        expected = x * (n / x.sum()) if x.sum() > 0 else np.full(x.size, n / x.size)
        draw = _uniform_draws(uniforms, rng, 1 + n)
        counts = controlled_counts(expected[None, :], np.array([n]), draw(1))[0]
        cells = np.repeat(np.arange(x.size), counts)[np.argsort(draw(n), kind="stable")]
        return estimate.domain.unravel(cells)
    model = fit_network(estimate, max_parents=max_parents) if model is None else model
    draw = _uniform_draws(uniforms, rng, uniforms_needed(model, n))
    return model.sample_codes(int(n), draw)


def product_records(domain, groups, n: int, *, uniforms=None, rng=None) -> np.ndarray:
    """Codes ``(n, d)`` of ``n`` records from a product of independent group tables.

    ``groups``: ``(axes, probabilities)`` pairs covering every attribute once (axes sorted, the
    table shaped by their sizes) — e.g. the groups of factored MWEM's
    :class:`~dpopt.estimate.engines.factored.FactoredTable`. Each group's cells get the floor or
    ceiling of ``n p`` records (systematic rounding, :func:`controlled_counts`), in a random order
    drawn independently per group, so groups stay independent and each group's marginal is kept
    to within a record. Randomness as for :func:`synthetic_records`.
    """
    if (uniforms is None) == (rng is None):
        raise ParameterError("give exactly one of uniforms= (an array of uniforms on [0, 1)) and rng=")
    n = int(n)
    draw = _uniform_draws(uniforms, rng, len(groups) * (n + 1))
    codes = np.zeros((n, len(domain)), dtype=np.int64)
    for axes, table in groups:
        p = np.maximum(np.asarray(table, dtype=np.float64).ravel(), 0.0)
        p = p / p.sum()
        counts = controlled_counts((n * p)[None, :], np.array([n]), draw(1))[0]
        cells = np.repeat(np.arange(p.size), counts)[np.argsort(draw(n), kind="stable")]
        codes[:, list(axes)] = np.stack(np.unravel_index(cells, np.shape(table)), axis=1)
    return codes


def _uniform_draws(uniforms, rng, needed: int):
    if uniforms is not None:
        u = np.asarray(uniforms, dtype=np.float64).ravel()
        if u.size < needed:
            raise ParameterError(f"uniforms: {u.size} given, {needed} needed")
        if u.size and (u.min() < 0 or u.max() >= 1 or not np.isfinite(u).all()):
            raise ParameterError("uniforms must lie in [0, 1)")
        position = [0]

        def draw(m):
            out = u[position[0]:position[0] + m]
            position[0] += m
            return out

        return draw
    if hasattr(rng, "words"):  # a dpopt RandomSource: 53-bit uniforms from its 64-bit words
        return lambda m: (rng.words(m) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    if hasattr(rng, "random"):
        return lambda m: rng.random(m)
    raise ParameterError(f"rng must be a dpopt RandomSource or a numpy Generator, got {type(rng).__name__}")
