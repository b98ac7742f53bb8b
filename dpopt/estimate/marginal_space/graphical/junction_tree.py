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

**Out of clique.** A set ``W`` no clique holds is read off the calibrated tree by variable
elimination over the smallest subtree ``T`` with a clique holding each attribute of ``W`` (the
"out-of-clique" queries of Koller and Friedman 2009, §10.3.3 — the section as the brief and
Private-PGM's notes give it; not checked against the book). On ``T`` the measure's marginal is
``Π_{C∈T} μ_C / Π_{S∈T} μ_S`` (the factorisation above, restricted: a branch outside ``T`` sums
to one), so with ``T`` rooted at ``r`` the message from ``C`` towards its neighbour over ``S`` is

    m_C(S, K_C) = Σ_{C ∖ (S ∪ W)} μ_C Π_{children j} m_j / μ_S,     μ_W = Σ_{C_r ∖ W} μ_r Π_j m_j,

where ``K_C`` are the attributes of ``W`` its branch holds outside ``S``: the attributes kept
are batch axes of one pass, not a loop over their values. The arithmetic is linear, on the
calibrated ``μ`` (finite: each sums to ``Σ x``) and conditionals ``μ_C/μ_S ≤ 1``, so nothing
overflows; where a separator cell underflowed to 0 the message is 0 (so are the clique's cells
there). Each product is of two arrays at a time, summed first over the axes nothing later
needs, so the largest array is known from the attribute sets alone (:meth:`JunctionTree.read_plans` checks it before anything is allocated;
the root is the clique of ``W``'s last attribute, or the one with the smallest largest array
when that exceeds :data:`SMALL_READ` cells). A message depends only on its edge, direction and
``K_C``, so sets share them (``(a, ·)`` pairs share every message carrying ``a``). This
replaced one calibration per value of ``W`` less its last attribute (142,807 calibrations of
adult's chain tree to read the 352 of its 364 triples no clique holds; issue 27).

The cliques are the elimination cliques of a greedy minimum-fill elimination ordering (Rose
1972; Koller and Friedman 2009, §9.4.3: exact for a chordal graph, where no edge is filled); the
tree is a maximum-weight spanning tree on separator sizes (Jensen and Jensen 1994), so that
it has the running-intersection property. Components are joined by empty separators.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple, Sequence

import numpy as np

from dpopt.errors import DomainError

__all__ = ["JunctionTree", "elimination_cliques"]


#: Plans whose largest array holds at most this many cells take the default root (the clique of
#: the set's last attribute, so that sets sharing their leading attributes share messages).
SMALL_READ = 2**16
#: Messages :meth:`JunctionTree.set_marginals` keeps for later sets (cells; 128 MB of doubles).
READ_CACHE_CELLS = 2**24


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
        self.max_cells = int(max_cells)
        self._depth = [0] * k
        for c in self.order[1:]:
            self._depth[c] = self._depth[self.parent[c]] + 1
        self._attribute_sets = [frozenset(c) for c in self.cliques]
        self._elimination_sizes: dict = {}  # (clique, its inputs' axes, its output's axes) -> largest array
        self._top: dict[int, int] = {}  # each attribute's clique nearest the root (its cliques' subtree's top)
        for c in self.order:
            for a in self.cliques[c]:
                self._top.setdefault(a, c)
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
    def read_plans(self, sets: Sequence[tuple[int, ...]], limit: int | None = None,
                   names: Sequence[str] | None = None) -> list["ReadPlan"]:
        """The elimination plan of every set (sorted axes) that no clique holds (module notes, "Out
        of clique"), from the tree's structure alone. DomainError, before anything is allocated,
        when one plan's largest array would hold more than ``limit`` cells (default: the tree's
        ``max_cells``); the message names the set and the cells."""
        limit = self.max_cells if limit is None else int(limit)
        plans = []
        for s in sets:
            plan = self._read_plan(tuple(s))
            if plan.largest > limit:
                label = ", ".join(names[a] for a in s) if names is not None else str(tuple(s))
                raise DomainError(f"reading the marginal on ({label}) off the junction tree needs an array of "
                                  f"{plan.largest:,} cells, above max_cells = {limit:,}")
            plans.append(plan)
        return plans

    def set_marginals(self, mu: list[np.ndarray], sets: Sequence, deadline: float | None = None,
                      cache_cells: int = READ_CACHE_CELLS) -> dict[tuple[int, ...], np.ndarray] | None:
        """``{axes: marginal}`` (arrays over the sorted axes) of the calibrated measure ``μ``; None
        when ``time.perf_counter()`` passes ``deadline`` before every set is read.

        ``sets``: axis tuples or their :meth:`read_plans`. A set inside a clique is summed from it;
        any other set by variable elimination over the smallest subtree that reaches all its
        attributes (module notes, "Out of clique"): one batched pass, whatever the number of values
        of the attributes kept. Messages are shared between sets (up to ``cache_cells`` cells held).
        """
        mu_sep = [None] * len(self.cliques)
        for c in self.order[1:]:
            mu_sep[c] = _sum(mu[c], self._sum_child[c])
        out: dict = {}
        cache: dict = {}
        held_cells = 0
        for s in sets:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            plan = s if isinstance(s, ReadPlan) else None
            axes = plan.axes if plan is not None else tuple(s)
            if plan is None:
                inside = next((i for i, c in enumerate(self.cliques) if set(axes) <= set(c)), None)
                if inside is not None:
                    out[axes] = _sum(mu[inside], self.summed_axes(inside, axes)).copy()
                    continue
                plan = self._read_plan(axes)
            messages: dict = {}
            for key, children, sep_of in plan.messages:
                if deadline is not None and time.perf_counter() > deadline:
                    return None
                clique, _, axes_out = key
                if key not in cache:
                    value = _eliminate(mu[clique], self.cliques[clique], [messages[j] for j in children],
                                       axes_out, self.sizes)
                    sep = mu_sep[sep_of]  # over the separator's axes, the first of axes_out
                    sep = sep.reshape(sep.shape + (1,) * (len(axes_out) - sep.ndim))
                    value = np.divide(value, sep, out=np.zeros_like(value), where=sep > 0)
                    if held_cells + value.size > cache_cells:
                        cache.clear()
                        held_cells = 0
                    cache[key] = value
                    held_cells += value.size
                messages[key] = (cache[key], axes_out)
            value = _eliminate(mu[plan.root], self.cliques[plan.root], [messages[j] for j in plan.root_children],
                               axes, self.sizes)
            out[axes] = value if plan.messages else value.copy()  # never a view of a clique's marginal
        return out

    def _read_plan(self, axes: tuple[int, ...]) -> "ReadPlan":
        """The smallest subtree reaching ``axes``, rooted where its largest array is smallest."""
        missing = [a for a in axes if a not in self._top]
        if missing:
            raise DomainError(f"no clique of the junction tree holds the attributes {tuple(missing)}")
        near = self._steiner(axes)
        default = next(c for c in near if axes[-1] in self.cliques[c])
        plan = self._schedule(axes, near, default)
        if plan.largest > SMALL_READ:  # worth trying every root (a few dozen set operations each)
            plan = min((self._schedule(axes, near, r) for r in near), key=lambda p: (p.largest, p.cells))
        return plan

    def _steiner(self, axes: tuple[int, ...]) -> dict[int, list[int]]:
        """The smallest subtree with a clique holding each of ``axes``, as adjacency lists: the
        paths joining each attribute's topmost clique, less leaves whose attributes of ``axes`` their
        neighbour holds too (by running intersection an attribute's cliques form a subtree)."""
        tops = {self._top[a] for a in axes}
        nodes, frontier = set(tops), set(tops)
        while len(frontier) > 1:  # climb from the deepest until the paths meet
            c = max(frontier, key=self._depth.__getitem__)
            frontier.discard(c)
            frontier.add(self.parent[c])
            nodes.add(self.parent[c])
        near: dict[int, list[int]] = {c: [] for c in nodes}
        for c in nodes:
            if self.parent[c] in near:
                near[c].append(self.parent[c])
                near[self.parent[c]].append(c)
        wanted = set(axes)
        leaves = [c for c in near if len(near[c]) == 1]
        while leaves:
            c = leaves.pop()
            if c in near and len(near[c]) == 1:
                (q,) = near[c]
                if wanted & self._attribute_sets[c] <= self._attribute_sets[q]:
                    del near[c]
                    near[q].remove(c)
                    if len(near[q]) == 1:
                        leaves.append(q)
        return near

    def _schedule(self, axes: tuple[int, ...], near: dict[int, list[int]], root: int) -> "ReadPlan":
        """Messages towards ``root`` over the subtree ``near`` (leaves first), each over its
        separator and the attributes of ``axes`` its branch holds, and the sizes they reach."""
        wanted = set(axes)
        above = {root: -1}
        order = [root]
        for c in order:
            for n in near[c]:
                if n != above[c]:
                    above[n] = c
                    order.append(n)
        below: dict[int, list] = {c: [] for c in order}
        carried: dict[int, set] = {}
        messages, largest, cells = [], 0, 0
        for c in reversed(order[1:]):
            q = above[c]
            owner = c if self.parent[c] == q else q  # the edge's separator is stored with its child
            here = wanted & self._attribute_sets[c]
            for j in near[c]:
                if j != q:
                    here |= carried[j]
            carried[c] = here
            sep = self.sep[owner]
            axes_out = sep + tuple(sorted(here.difference(sep)))
            big = self._cells(c, tuple(key[2] for key in below[c]), axes_out)
            largest, cells = max(largest, big), cells + big
            key = (c, q, axes_out)
            messages.append((key, tuple(below[c]), owner))
            below[q].append(key)
        big = self._cells(root, tuple(key[2] for key in below[root]), axes)
        return ReadPlan(axes, root, tuple(messages), tuple(below[root]), max(largest, big), cells + big)

    def _cells(self, clique: int, inputs: tuple, axes_out: tuple) -> int:
        """:func:`_elimination_cells` on the clique, remembered (sets share most messages)."""
        key = (clique, inputs, axes_out)
        if key not in self._elimination_sizes:
            self._elimination_sizes[key] = _elimination_cells(self.cliques[clique], list(inputs), axes_out, self.sizes)
        return self._elimination_sizes[key]


class ReadPlan(NamedTuple):
    """How :meth:`JunctionTree.set_marginals` reads one set no clique holds: ``messages`` as
    ``((clique, towards, axes), inputs, separator owner)`` leaves first, then ``root`` and the
    messages it takes; ``largest`` the cells of its largest array, ``cells`` of all of them."""

    axes: tuple
    root: int
    messages: tuple
    root_children: tuple
    largest: int
    cells: int


def _fold_axes(left: tuple, right: tuple, keep: set) -> tuple[tuple, tuple, tuple]:
    """One product of two arrays summed to ``keep``: each operand's axes after summing those no other
    operand and no later use needs, then the product's axes."""
    left = tuple(a for a in left if a in keep or a in right)
    right = tuple(a for a in right if a in keep or a in left)
    return left, right, tuple(a for a in left if a in keep) + tuple(a for a in right if a in keep and a not in left)


def _elimination_cells(clique: tuple, inputs: list[tuple], axes_out: tuple, sizes: list[int]) -> int:
    """The cells of the largest array :func:`_eliminate` makes (the same folds, on axes only)."""
    axes, largest = tuple(clique), 0
    for i, other in enumerate(inputs):
        keep = set(axes_out).union(*inputs[i + 1:])
        _, _, axes = _fold_axes(axes, other, keep)
        largest = max(largest, math.prod(sizes[a] for a in axes))
    return max(largest, math.prod(sizes[a] for a in axes_out))


def _eliminate(array: np.ndarray, axes: tuple, inputs: list, axes_out: tuple, sizes: list[int]) -> np.ndarray:
    """``Σ array · Π inputs`` over every axis not in ``axes_out``, in that order: one product of two
    arrays at a time (``inputs`` are ``(array, axes)``), each summed first over the axes no later
    product needs, so no array is larger than :func:`_elimination_cells` says."""
    for i, (other, other_axes) in enumerate(inputs):
        keep = set(axes_out).union(*(a for _, a in inputs[i + 1:]))
        left, right, result = _fold_axes(axes, other_axes, keep)
        array = _sum_to(array, axes, left)
        other = _sum_to(other, other_axes, right)
        label = {a: n for n, a in enumerate(dict.fromkeys(left + right))}
        array = np.einsum(array, [label[a] for a in left], other, [label[a] for a in right],
                          [label[a] for a in result], optimize=len(label) > 2 and array.size * other.size > 2**16)
        axes = result
    array = _sum_to(array, axes, tuple(a for a in axes if a in axes_out))
    axes = tuple(a for a in axes if a in axes_out)
    return np.transpose(array, [axes.index(a) for a in axes_out]) if axes != tuple(axes_out) else array


def _sum_to(array: np.ndarray, axes: tuple, kept: tuple) -> np.ndarray:
    """``array`` over ``axes`` summed to the subsequence ``kept``."""
    summed = tuple(i for i, a in enumerate(axes) if a not in kept)
    return array.sum(axis=summed) if summed else array


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
