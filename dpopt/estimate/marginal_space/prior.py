"""The independence prior for residuals no measurement covers.

A workload marginal above what was measured holds interactions (residual sets ``A``) that no
measurement identifies (``W_A = 0`` in equation (3) of :mod:`~dpopt.estimate.marginal_space.gls`).
The estimator gives them a weak quadratic prior (step 3 of
:mod:`~dpopt.estimate.marginal_space.estimator`); this module gives its *centre*: the residual
that the set would have if its attributes were independent across the groups that no
measurement links.

Two attributes of ``A`` are *linked* when some measured residual set inside ``A`` holds both
(measured sets are downward closed, so: when their pair is measured). Let ``A = B_1 ∪ ... ∪ B_m``
be the connected components of that graph. If the table were the product of its marginals on the
components, ``x_A = N^{1-m} ⊗_i marg_{B_i}(x)``, its residual would factorise (equation (2) of
:mod:`~dpopt.estimate.marginal_space.layout`: ``Q_A`` and the marginalisation are products over the
attributes)::

    c_A  =  N^{1-m}  ⊗_i  c_{B_i}              (axes back in increasing order)          (5)

with ``N = c_∅`` the total. That is the centre used for an unmeasured ``A`` with ``m >= 2``
(``c_{B_i}`` the fitted residual of a measured component, or its own centre); a connected
unmeasured ``A`` (``m = 1``: every pair measured, the set itself not) is centred at zero, the
minimum-norm choice ("no interaction beyond the measured ones"). An attribute no measurement
covers has ``c_a = 0`` (uniform), so its products are zero too.

So two attributes whose pair was never measured are released as independent given their
measured one-way marginals (``μ_ab = μ_a ⊗ μ_b / N``, the maximum-entropy completion of the two
one-way marginals) rather than additively (``c_ab = 0``, which is not independence unless one
of them is uniform and can go negative); a triple with one measured pair ``ab`` gets
``μ_abc = μ_ab ⊗ μ_c / N``. A graphical model's maximum-entropy completion would also carry
dependence through a common neighbour (``a–b`` and ``b–c`` measured: ``a`` and ``c`` dependent
through ``b``); this prior does not (``a, b, c`` are one component: centre zero).

Vectorised: the sets of one size at once (pair lookups, components by boolean closure), the
outer products by groups of one shape and split; no loop over cells or sets.
"""

from __future__ import annotations

import math

import numpy as np

from dpopt.estimate.marginal_space.layout import ResidualIndex

__all__ = ["independence_prior"]


def independence_prior(index: ResidualIndex, target: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Residuals (flat, ``index`` layout): ``target`` on measured sets, equation (5) on the others.

    Parameters
    ----------
    index : ResidualIndex
    target : ndarray
        Fitted residuals (flat); the entries of unmeasured sets are ignored.
    measured : ndarray of bool
        Per residual set: covered by a measurement (noisy or exact).

    Returns
    -------
    ndarray
        A new flat vector. With a non-positive total (``c_∅ <= 0``, possible under heavy noise)
        every unmeasured set is centred at zero.
    """
    out = np.where(index.per_set(measured) > 0, target, 0.0)
    total = float(out[index.set_offsets[index.position_of(())]]) if measured[index.position_of(())] else 0.0
    if not total > 0:
        return out
    order = index.set_order
    sizes = index.sizes
    for k in range(2, int(order.max(initial=0)) + 1):
        rows = np.flatnonzero((order == k) & ~measured & (index.set_cells > 0))
        if not rows.size:
            continue
        axes = np.asarray([index.set_axes[p] for p in rows], dtype=np.int64).reshape(len(rows), k)
        reach = _component_of_first(index, axes, measured)
        split = ~reach.all(axis=1)  # m >= 2 components; connected sets stay centred at zero
        if not split.any():
            continue
        rows, axes, reach = rows[split], axes[split], reach[split]
        # Groups of one shape and one split: their outer products are one batched product.
        key = np.concatenate([reach.astype(np.int64), sizes[axes]], axis=1)
        groups, which = np.unique(key, axis=0, return_inverse=True)
        for g in range(len(groups)):
            members = np.flatnonzero(which.ravel() == g)
            first = reach[members[0]]
            head, tail = axes[members][:, first], axes[members][:, ~first]
            a = _blocks(index, out, head)  # (G, cells of head)
            b = _blocks(index, out, tail)
            shape = [int(sizes[x]) - 1 for x in axes[members[0]]]
            place = np.concatenate([np.flatnonzero(first), np.flatnonzero(~first)])
            product = (a[:, :, None] * b[:, None, :] / total).reshape(
                [len(members)] + [shape[p] for p in place])
            product = np.transpose(product, [0] + [1 + int(i) for i in np.argsort(place)])
            cells = math.prod(shape)
            at = index.set_offsets[rows[members]][:, None] + np.arange(cells)[None, :]
            out[at] = product.reshape(len(members), cells)
    return out


def _component_of_first(index: ResidualIndex, axes: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """``(M, k)`` bool: the positions of each row linked (through measured pairs) to its first attribute."""
    m, k = axes.shape
    adjacency = np.zeros((m, k, k), dtype=bool)
    for p in range(k):  # k(k-1)/2 batched lookups, each over every row
        for q in range(p + 1, k):
            linked = measured[index.positions(axes[:, [p, q]])]
            adjacency[:, p, q] = adjacency[:, q, p] = linked
    reach = np.zeros((m, k), dtype=bool)
    reach[:, 0] = True
    for _ in range(k - 1):
        reach = reach | (np.einsum("mp,mpq->mq", reach.astype(np.int32), adjacency.astype(np.int32)) > 0)
    return reach


def _blocks(index: ResidualIndex, flat: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """The residual blocks of the rows of ``axes`` (one shape), stacked: ``(M, cells)``."""
    positions = index.positions(axes)
    cells = int(index.set_cells[positions[0]])
    return flat[index.set_offsets[positions][:, None] + np.arange(cells)[None, :]]
