"""A junction tree over attribute sets, with log-domain sum-product and its forward-mode derivative.

A measure on the full domain that is a product of positive factors on attribute sets,
``x = exp(Σ_F ψ_F)``, is *Markov* on any junction tree whose cliques hold every factor's set.
Its marginals on the cliques then come from two passes of messages over the tree's edges
(the sum-product algorithm; Lauritzen and Spiegelhalter 1988; Koller and Friedman 2009,
§10.2), never from the full table:

    m_{c→e}(s) = log Σ_{C∖S} exp(ψ_c + Σ_{k≠e} m_{k→c}),     log μ_C = ψ_c + Σ_k m_{k→c},

where ``S = C ∩ E`` is the separator. ``μ_C`` are the *unnormalised* marginals (``Σ μ_C = Σ x``
for every clique), and on a tree ``x = Π_C μ_C / Π_S μ_S`` cell by cell, so that for two
measures Markov on the same tree ``Σ x log(x/p) = Σ_C ⟨μ_C, log μ_C/π_C⟩ − Σ_S ⟨μ_S, log μ_S/π_S⟩``.

:meth:`JunctionTree.tangent` differentiates the marginals along a change ``f`` of the log
factors (forward mode): each message's derivative is the conditional expectation
``μ_C/μ_S`` of the derivatives entering it, so ``dμ_C = μ_C ∘ (f_c + Σ_k dm_{k→c})`` costs one
more pass and no exponentials. It gives the products ``C diag(x) Cᵀ v`` of a Newton step.

The cliques are the elimination cliques of a greedy minimum-fill elimination ordering (Rose
1972; Koller and Friedman 2009, §9.4.3: exact for a chordal graph, where no edge is filled); the
tree is a maximum-weight spanning tree on separator sizes (Jensen and Jensen 1994), so that
it has the running-intersection property. Components are joined by empty separators.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from dpopt.errors import DomainError

__all__ = ["JunctionTree", "elimination_cliques"]


def elimination_cliques(sizes: Sequence[int], sets: Sequence[Sequence[int]],
                        limit: int | None = None) -> list[tuple[int, ...]]:
    """The maximal cliques of the triangulation by greedy minimum fill-in (ties: fewer cells),
    as sorted axis tuples. Loops over attributes and their neighbours, never over cells.

    ``limit``: stop as soon as the cliques found hold more cells than this, and return them (a
    part of the cliques). Every clique holds the attribute eliminated with it, so none is
    contained in a later one and the running sum of cells only grows: a list above ``limit``
    means the whole tree would be. (A complete graph on 100 attributes then takes one step.)"""
    neighbours: dict[int, set[int]] = {}
    for s in sets:
        for a in s:
            neighbours.setdefault(int(a), set()).update(int(b) for b in s if b != a)
    logs = {a: math.log(max(int(sizes[a]), 1)) for a in neighbours}
    remaining = set(neighbours)
    cliques: list[frozenset] = []
    found = 0
    while remaining:
        def cost(v):
            near = neighbours[v] & remaining
            fill = sum(1 for u in near for w in near if u < w and w not in neighbours[u])
            return fill, logs[v] + sum(logs[u] for u in near), v
        v = min(remaining, key=cost)
        near = neighbours[v] & remaining
        for u in near:
            neighbours[u].update(near - {u})
        clique = frozenset(near | {v})
        if not any(clique <= c for c in cliques):
            cliques = [c for c in cliques if not c <= clique] + [clique]
            if limit is not None:
                found += math.prod(int(sizes[a]) for a in clique)
                if found > limit:
                    break
        remaining.discard(v)
    return [tuple(sorted(c)) for c in cliques]


class JunctionTree:
    """Cliques (sorted axis tuples), a rooted spanning tree on them, and message passing.

    Parameters
    ----------
    sizes : sequence of int
        The attributes' numbers of values (the domain's sizes).
    sets : sequence of axis tuples
        Every factor's attribute set; every attribute should appear in one (alone if need be).
    max_cells : int
        DomainError, before anything is allocated, when the cliques hold more cells than this
        (it names the largest clique and its cells).
    names : sequence of str, optional
        Attribute names for that message.
    """

    def __init__(self, sizes: Sequence[int], sets: Sequence[Sequence[int]], max_cells: int,
                 names: Sequence[str] | None = None) -> None:
        self.sizes = [int(s) for s in sizes]
        self.cliques = elimination_cliques(self.sizes, sets, max_cells)  # stops once above max_cells
        self.shapes = [tuple(self.sizes[a] for a in c) for c in self.cliques]
        cells = [math.prod(s) for s in self.shapes]
        self.cells = int(sum(cells))
        if self.cells > max_cells:
            big = int(np.argmax(cells))
            label = ", ".join(names[a] for a in self.cliques[big]) if names is not None else str(self.cliques[big])
            raise DomainError(f"the junction tree's cliques hold at least {self.cells:,} cells, above max_cells = "
                              f"{max_cells:,} (largest clique: {label} with {cells[big]:,} cells)")
        k = len(self.cliques)
        # Maximum-weight spanning tree (Kruskal) on separator sizes; weight-0 edges join components.
        edges = sorted(((len(set(self.cliques[i]) & set(self.cliques[j])), i, j)
                        for i in range(k) for j in range(i + 1, k)), reverse=True)
        root_of = list(range(k))

        def find(i):
            while root_of[i] != i:
                root_of[i] = root_of[root_of[i]]
                i = root_of[i]
            return i

        adjacent: dict[int, list[int]] = {i: [] for i in range(k)}
        for _, i, j in edges:
            a, b = find(i), find(j)
            if a != b:
                root_of[a] = b
                adjacent[i].append(j)
                adjacent[j].append(i)
        self.parent = [-1] * k
        self.order = [0]  # root first, every clique after its parent
        seen = {0}
        for c in self.order:
            for e in adjacent[c]:
                if e not in seen:
                    seen.add(e)
                    self.parent[e] = c
                    self.order.append(e)
        self.children = [[] for _ in range(k)]
        for c in self.order[1:]:
            self.children[self.parent[c]].append(c)
        # Separator with the parent: positions in the child and in the parent, summed axes of each.
        self.sep = [()] * k
        self._sum_child = [()] * k
        self._sum_parent = [()] * k
        self._shape_in_child = [()] * k
        self._shape_in_parent = [()] * k
        for c in self.order[1:]:
            p = self.parent[c]
            sep = tuple(sorted(set(self.cliques[c]) & set(self.cliques[p])))
            self.sep[c] = sep
            self._sum_child[c] = tuple(i for i, a in enumerate(self.cliques[c]) if a not in sep)
            self._sum_parent[c] = tuple(i for i, a in enumerate(self.cliques[p]) if a not in sep)
            self._shape_in_child[c] = tuple(self.sizes[a] if a in sep else 1 for a in self.cliques[c])
            self._shape_in_parent[c] = tuple(self.sizes[a] if a in sep else 1 for a in self.cliques[p])

    # ---- placing sets -------------------------------------------------------------------------
    def holder(self, axes: Sequence[int]) -> int:
        """The first clique holding ``axes`` (the junction tree holds every factor's set)."""
        target = set(axes)
        for i, c in enumerate(self.cliques):
            if target <= set(c):
                return i
        raise DomainError(f"no clique of the junction tree holds the attributes {tuple(axes)}")

    def broadcast_shape(self, clique: int, axes: Sequence[int]) -> tuple[int, ...]:
        """The shape that broadcasts an array over ``axes`` (sorted) into the clique's array."""
        return tuple(self.sizes[a] if a in axes else 1 for a in self.cliques[clique])

    def summed_axes(self, clique: int, axes: Sequence[int]) -> tuple[int, ...]:
        """The clique's array positions to sum to get the marginal on ``axes`` (sorted)."""
        return tuple(i for i, a in enumerate(self.cliques[clique]) if a not in axes)

    # ---- sum-product --------------------------------------------------------------------------
    def calibrate(self, log_factors: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray], float]:
        """``(μ_C per clique, μ_S per clique's separator with its parent, log Σ x)`` of the measure
        whose log factor on clique ``c`` is ``log_factors[c]`` (module notes)."""
        k = len(self.cliques)
        up: list = [None] * k
        for c in reversed(self.order[1:]):
            a = log_factors[c]
            for j in self.children[c]:
                a = a + up[j].reshape(self._shape_in_parent[j])
            up[c] = _log_sum(a, self._sum_child[c])
        belief: list = [None] * k
        root = self.order[0]
        b = log_factors[root]
        for j in self.children[root]:
            b = b + up[j].reshape(self._shape_in_parent[j])
        belief[root] = b
        for c in self.order[1:]:
            p = self.parent[c]
            down = _log_sum(belief[p] - up[c].reshape(self._shape_in_parent[c]), self._sum_parent[c])
            b = log_factors[c] + down.reshape(self._shape_in_child[c])
            for j in self.children[c]:
                b = b + up[j].reshape(self._shape_in_parent[j])
            belief[c] = b
        log_total = float(_log_sum(belief[root], tuple(range(belief[root].ndim))))
        mu = [np.exp(b) for b in belief]
        mu_sep = [None] * k
        for c in self.order[1:]:
            mu_sep[c] = mu[c].sum(axis=self._sum_child[c]) if self._sum_child[c] else mu[c].copy()
        return mu, mu_sep, log_total

    def tangent(self, mu: list[np.ndarray], mu_sep: list, f: list) -> list[np.ndarray]:
        """``μ_C ∘ dB_C``: the derivative of every clique marginal along the change ``f`` of the log
        factors (``f[c]`` broadcastable to clique ``c``, or None), at the calibrated ``μ`` (module notes)."""
        k = len(self.cliques)
        dup: list = [None] * k
        for c in reversed(self.order[1:]):
            g = f[c] if f[c] is not None else 0.0
            for j in self.children[c]:
                g = g + dup[j].reshape(self._shape_in_parent[j])
            dup[c] = _sum(mu[c] * g, self._sum_child[c]) / mu_sep[c] if np.ndim(g) else np.full(mu_sep[c].shape, g)
        weighted: list = [None] * k
        root = self.order[0]
        g = f[root] if f[root] is not None else 0.0
        for j in self.children[root]:
            g = g + dup[j].reshape(self._shape_in_parent[j])
        weighted[root] = mu[root] * g
        for c in self.order[1:]:
            p = self.parent[c]
            ddown = _sum(weighted[p], self._sum_parent[c]) / mu_sep[c] - dup[c]
            g = (f[c] if f[c] is not None else 0.0) + ddown.reshape(self._shape_in_child[c])
            for j in self.children[c]:
                g = g + dup[j].reshape(self._shape_in_parent[j])
            weighted[c] = mu[c] * g
        return weighted


    # ---- marginals outside the cliques --------------------------------------------------------
    def set_marginals(self, log_factors: list[np.ndarray], mu: list[np.ndarray], sets: Sequence[tuple[int, ...]],
                      deadline: float | None = None) -> dict[tuple[int, ...], np.ndarray] | None:
        """``{axes: marginal}`` (arrays over the sorted axes) of the calibrated measure ``μ``; None
        when ``time.perf_counter()`` passes ``deadline`` before every set is read.

        A set inside a clique is summed from it. Any other set ``W`` is read by conditioning:
        for every value ``w`` of ``W`` less its last attribute ``l``, the measure restricted to
        ``W∖l = w`` (its factors times the indicator, as :data:`EVIDENCE` in log) is calibrated
        again, and its marginal on ``l`` is ``μ_W(w, ·)`` exactly. Sets sharing ``W∖l`` share the
        passes: every pair ``(a, ·)`` costs ``n_a`` passes together. The loop is over the values
        conditioned on, each one pass of messages, never over cells.
        """
        out: dict = {}
        pending: dict = {}
        for s in sets:
            s = tuple(s)
            held = next((i for i, c in enumerate(self.cliques) if set(s) <= set(c)), None)
            if held is not None:
                summed = self.summed_axes(held, s)
                out[s] = mu[held].sum(axis=summed) if summed else mu[held].copy()
            else:
                pending.setdefault(s[:-1], []).append(s)
        for condition, group in pending.items():
            shape = tuple(self.sizes[a] for a in condition)
            results = {s: np.empty(shape + (self.sizes[s[-1]],)) for s in group}
            holders = [self.holder((a,)) for a in condition]
            for values in np.ndindex(*shape):
                if deadline is not None and time.perf_counter() > deadline:
                    return None
                factors = list(log_factors)
                for a, v, h in zip(condition, values, holders):
                    mask = np.full(self.sizes[a], EVIDENCE)
                    mask[v] = 0.0
                    factors[h] = factors[h] + mask.reshape(self.broadcast_shape(h, (a,)))
                restricted, _, _ = self.calibrate(factors)
                for s in group:
                    h = self.holder((s[-1],))
                    summed = self.summed_axes(h, (s[-1],))
                    results[s][values] = restricted[h].sum(axis=summed) if summed else restricted[h]
            out.update(results)
        return out


#: The log factor of a value ruled out by conditioning: its cells underflow to exactly 0 while
#: every difference of log messages stays finite (an infinite one would give NaN).
EVIDENCE = -1e3


def _sum(a: np.ndarray, axes: tuple) -> np.ndarray:
    return a.sum(axis=axes) if axes else a


def _log_sum(a: np.ndarray, axes: tuple) -> np.ndarray:
    """``log Σ exp(a)`` over ``axes`` (stable)."""
    if not axes:
        return a
    top = np.max(a, axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    out = np.log(np.sum(np.exp(a - top), axis=axes)) + np.squeeze(top, axis=axes)
    return out
