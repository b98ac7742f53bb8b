"""A strictly positive point of the problem's constraints, for the repair step of the projection.

The repair (:func:`~dpopt.estimate.marginal_space.polytope.projection.repair`) mixes the dual's primal
point with a point whose marginals are positive wherever a feasible point can be positive and
that keeps every fixed residual and structural zero. Built as a product distribution:

- attributes are grouped into *blocks*: the connected components of the attribute sets of the
  exact marginals (invariants) and of the structural-zero patterns;
- on each block a dense table starts uniform on the cells no zero pattern forbids and is
  brought onto the block's exact marginals by iterative proportional fitting (Deming and
  Stephan 1940), which converges to the maximum-entropy table with those marginals: positive
  on every cell some such table puts mass on;
- attributes in no block are uniform and independent.

The residuals of a product are products of the blocks' residuals (equation (2) factorises):
``c_A = N prod_B Q_{A∩B} marg_{A∩B}(P_B)``, zero as soon as ``A`` holds an attribute outside
every block. Blocks are limited to :data:`MAX_BLOCK_CELLS` cells; beyond that (or when the
fitting does not reach the invariants) no interior point is built and the projection relies
on its feasibility tolerance alone.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from dpopt.estimate.marginal_space.layout import ResidualIndex, contrast

__all__ = ["interior_residuals", "MAX_BLOCK_CELLS"]

#: Largest dense block table built for the interior point.
MAX_BLOCK_CELLS = 2**22
#: Largest number of residual sets inside the blocks' attributes (each is an outer product).
MAX_BLOCK_SETS = 20000


def interior_residuals(index: ResidualIndex, exact: Sequence[tuple[tuple[int, ...], np.ndarray]],
                       zeros: Sequence[tuple[tuple[int, ...], np.ndarray]], total: float | None,
                       *, tol: float = 1e-12, max_sweeps: int = 2000) -> np.ndarray | None:
    """Residuals (flat, ``index`` layout) of the product point, or None when it cannot be built.

    ``exact``: ``(axes, values)`` of every exact marginal (counts, C order over sorted axes);
    ``zeros``: ``(axes, mask)`` of every structural-zero pattern (True: forbidden);
    ``total``: the fixed total, or None for a free total (the point then has total 1).
    """
    sizes = index.sizes
    sets = [tuple(a) for a, _ in exact if len(a)] + [tuple(a) for a, _ in zeros]
    blocks = _components(sets)
    n_total = 1.0 if total is None else float(total)
    if n_total <= 0:
        return None
    tables: dict[tuple[int, ...], np.ndarray] = {}
    for block in blocks:
        shape = tuple(int(sizes[a]) for a in block)
        if math.prod(shape) > MAX_BLOCK_CELLS:
            return None
        table = np.ones(shape)
        for axes, mask in zeros:
            if set(axes) <= set(block):
                table *= _broadcast(~np.asarray(mask, dtype=bool).reshape([int(sizes[a]) for a in axes]),
                                    axes, block).astype(np.float64)
        table /= table.sum() if table.sum() > 0 else 1.0
        targets = [(axes, np.asarray(v, dtype=np.float64).reshape([int(sizes[a]) for a in axes]) / n_total)
                   for axes, v in exact if len(axes) and set(axes) <= set(block)]
        if targets:
            table = _fit(table, block, targets, tol, max_sweeps)
            if table is None:
                return None
        tables[block] = table
    covered = np.zeros(len(sizes), dtype=bool)
    for block in blocks:
        covered[list(block)] = True
    out = np.zeros(index.size)
    out[index.set_offsets[index.position_of(())]] = n_total
    inside = [p for p, axes in enumerate(index.set_axes) if axes and covered[list(axes)].all()]
    if len(inside) > MAX_BLOCK_SETS:
        return None
    for p in inside:
        start = index.set_offsets[p]
        out[start:start + index.set_cells[p]] = n_total * _product_residual(index.set_axes[p], tables).ravel()
    return out


def _product_residual(axes: tuple[int, ...], tables: dict) -> np.ndarray:
    """``prod_B Q_{A∩B} marg_{A∩B}(P_B)`` over ``A``'s coefficients (axes in increasing order)."""
    parts, order = [], []
    for block, table in tables.items():
        inner = [a for a in axes if a in block]
        if not inner:
            continue
        keep = tuple(block.index(a) for a in inner)
        m = table.sum(axis=tuple(i for i in range(len(block)) if i not in keep))
        parts.append(contrast(m))
        order.extend(inner)
    out = parts[0]
    for p in parts[1:]:
        out = np.multiply.outer(out, p)
    perm = np.argsort(order)
    return np.transpose(out, perm)


def _components(sets: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Connected components (sorted attribute tuples) of overlapping attribute sets."""
    parent: dict[int, int] = {}

    def find(a: int) -> int:
        while parent.setdefault(a, a) != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for s in sets:
        for a in s:
            find(a)
        for a, b in zip(s, s[1:]):
            parent[find(a)] = find(b)
    groups: dict[int, list[int]] = {}
    for a in parent:
        groups.setdefault(find(a), []).append(a)
    return [tuple(sorted(g)) for g in groups.values()]


def _broadcast(array: np.ndarray, axes: tuple[int, ...], block: tuple[int, ...]) -> np.ndarray:
    shape = [1] * len(block)
    for a, n in zip(axes, array.shape):
        shape[block.index(a)] = n
    return array.reshape(shape)


def _fit(table: np.ndarray, block: tuple[int, ...], targets, tol: float, max_sweeps: int) -> np.ndarray | None:
    """Iterative proportional fitting of ``table`` onto the ``targets`` (probabilities)."""
    for _ in range(max_sweeps):
        worst = 0.0
        for axes, target in targets:
            keep = tuple(block.index(a) for a in axes)
            drop = tuple(i for i in range(len(block)) if i not in keep)
            current = table.sum(axis=drop) if drop else table
            worst = max(worst, float(np.abs(current - target).max()))
            ratio = np.divide(target, current, out=np.zeros_like(target), where=current > 0)
            table = table * _broadcast(ratio, axes, block)
        if worst <= tol:
            return table
    return None
