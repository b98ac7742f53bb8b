"""Wide binary test data from a known sparse Bayesian network, with the network's exact marginals.

Benchmark and test data for the marginal-space estimator (issue 27): ``d`` binary attributes in
a fixed order, each with at most ``max_parents`` parents among the ``window`` attributes just
before it, and a logistic conditional probability ``P(x_i = 1 | parents) = sigmoid(b_i + sum_j
w_ij x_j)``. Because every parent lies within ``window`` places, the exact marginals of the
network follow from a forward pass over the joint law of a sliding window of attributes
(``2^window`` states, the network's treewidth), with the attributes of the marginal carried
along: every 1-, 2- or 3-way marginal of a 100-attribute network in seconds.

The parameters and the records are drawn from numpy's generator with the given seed: this is
test data, not privacy noise, and nothing here is private.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np

from dpopt.errors import ParameterError
from dpopt.model.data import Dataset
from dpopt.model.domain import Domain

__all__ = ["SparseBayesNet", "random_sparse_network"]


@dataclass(frozen=True)
class SparseBayesNet:
    """A binary Bayesian network whose parents lie within ``window`` places before each attribute.

    Attributes
    ----------
    domain : Domain
        ``d`` binary attributes ``x000, x001, ...`` in topological order.
    parents : tuple of tuple of int
        The parents of each attribute (earlier attributes, at most ``window`` places before).
    bias, weights : tuple
        ``P(x_i = 1 | parents) = 1 / (1 + exp(-(bias[i] + weights[i] @ x_parents)))``.
    window : int
    """

    domain: Domain
    parents: tuple
    bias: tuple
    weights: tuple
    window: int

    @property
    def d(self) -> int:
        return len(self.domain)

    def probability_one(self, i: int, parent_values: np.ndarray) -> np.ndarray:
        """``P(x_i = 1 | parents)`` for rows of parent values (shape ``(m, len(parents[i]))``)."""
        z = self.bias[i] + np.asarray(parent_values, dtype=np.float64) @ np.asarray(self.weights[i], dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-z))

    def sample(self, n: int, seed: int | np.random.Generator) -> Dataset:
        """``n`` records by ancestral sampling (vectorised over the records)."""
        gen = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        codes = np.zeros((int(n), self.d), dtype=np.int64)
        for i in range(self.d):
            p = self.probability_one(i, codes[:, list(self.parents[i])])
            codes[:, i] = gen.random(int(n)) < p
        return Dataset(codes, self.domain)

    # ---- exact marginals ------------------------------------------------------------------------
    def marginals(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Every ``k``-way marginal (``k`` in 1..3) as probabilities: ``(combos, cells)``.

        ``combos`` (M, k) in lexicographic order (the order of
        :func:`dpopt.model.queries.all_marginals`), ``cells`` (M, 2^k) in C order. Computed by a
        forward pass per first attribute carrying the marginal's earlier attributes in the state.
        """
        if k not in (1, 2, 3):
            raise ParameterError(f"k must be 1, 2 or 3, got {k!r}")
        d = self.d
        combos = np.array(list(combinations(range(d), k)), dtype=np.int64).reshape(-1, k)
        cells = np.empty((len(combos), 2**k))
        if k == 1:
            for i, p in enumerate(self._single_marginals()):
                cells[i] = (1 - p, p)
            return combos, cells
        position = {tuple(c): r for r, c in enumerate(combos.tolist())}
        for first in range(d - k + 1):
            # Carry x_first (and for k = 3 a second attribute, one pass each) through the rest.
            seconds = [None] if k == 2 else list(range(first + 1, d - 1))
            for second in seconds:
                carried = (first,) if second is None else (first, second)
                for j, table in self._carry(carried):
                    key = carried + (j,)
                    cells[position[key]] = table.ravel()
        return combos, cells

    def _single_marginals(self) -> np.ndarray:
        out = np.empty(self.d)
        for j, table in self._carry(()):
            out[j] = table[1]
        return out

    def _carry(self, carried: tuple[int, ...]):
        """Yield ``(j, P(x_carried, x_j))`` for every ``j`` after the carried attributes (all ``j`` when
        nothing is carried), by a forward pass over the joint law of (carried, window)."""
        w = self.window
        c = len(carried)
        start = carried[-1] + 1 if carried else 0
        # The law over (carried attributes, the last w attributes before `start`), as an array
        # (2,)*c + (2,)*w; attributes before 0 are constant 0.
        law = np.zeros((2,) * (c + w))
        law[(0,) * (c + w)] = 1.0
        # Build the law at `start` by a forward pass from attribute 0 (carried values fixed when reached).
        for i in range(0, start):
            law = self._step(law, i, c)
            if i in carried:
                # x_i just entered the window's last slot: copy it into its carried slot.
                law = _copy_last_into(law, carried.index(i), c, w)
        for j in range(start, self.d):
            law = self._step(law, j, c)
            table = law.sum(axis=tuple(range(c, c + w - 1)))  # (carried..., x_j)
            yield j, table

    def _step(self, law: np.ndarray, i: int, c: int) -> np.ndarray:
        """Add attribute ``i`` to the window (dropping the oldest slot)."""
        w = self.window
        # Window slot s (0..w-1) holds attribute i - w + s.
        states = np.stack(np.meshgrid(*[[0, 1]] * w, indexing="ij"), axis=-1).reshape(-1, w)
        slots = [w - (i - p) for p in self.parents[i]]
        p1 = self.probability_one(i, states[:, slots]).reshape((2,) * w)
        shape = (1,) * c + (2,) * w
        new_one = law * p1.reshape(shape)
        new_zero = law - new_one
        # Drop the oldest slot (sum it out), append x_i.
        zero = new_zero.sum(axis=c)
        one = new_one.sum(axis=c)
        return np.stack([zero, one], axis=-1)


def _copy_last_into(law: np.ndarray, slot: int, c: int, w: int) -> np.ndarray:
    """Move the joint mass so that carried slot ``slot`` equals the newest window slot."""
    out = np.zeros_like(law)
    for v in (0, 1):
        src = [slice(None)] * (c + w)
        src[slot] = 0  # carried slots start at 0 until their attribute is reached
        src[-1] = v
        dst = [slice(None)] * (c + w)
        dst[slot] = v
        dst[-1] = v
        out[tuple(dst)] += law[tuple(src)]
    return out


def random_sparse_network(d: int, seed: int = 0, *, window: int = 3, max_parents: int = 2,
                          strength: float = 2.0) -> SparseBayesNet:
    """A random network: each attribute after the first takes ``1..max_parents`` parents among the ``window``
    attributes before it, a bias uniform in [-2, 1] (sparse-ish ones) and weights of magnitude
    uniform in [0.5, 1] times ``strength`` with random signs. Drawn from ``numpy`` with ``seed``."""
    if not (isinstance(d, int) and d >= 1):
        raise ParameterError(f"d must be a positive integer, got {d!r}")
    if not (1 <= max_parents <= window <= 12):
        raise ParameterError(f"need 1 <= max_parents <= window <= 12, got {max_parents}, {window}")
    gen = np.random.default_rng(seed)
    parents, bias, weights = [], [], []
    for i in range(d):
        pool = np.arange(max(0, i - window), i)
        count = int(gen.integers(1, min(max_parents, len(pool)) + 1)) if len(pool) else 0
        chosen = tuple(int(p) for p in np.sort(gen.choice(pool, size=count, replace=False))) if count else ()
        parents.append(chosen)
        bias.append(float(gen.uniform(-2.0, 1.0)))
        magnitude = gen.uniform(0.5, 1.0, size=count) * strength
        weights.append(tuple(float(v) for v in magnitude * gen.choice([-1.0, 1.0], size=count)))
    domain = Domain(tuple(f"x{i:03d}" for i in range(d)), (2,) * d)
    return SparseBayesNet(domain, tuple(parents), tuple(bias), tuple(weights), int(window))
