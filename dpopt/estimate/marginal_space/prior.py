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


def shrink_to_independence(index: ResidualIndex, target: np.ndarray, weight: np.ndarray, measured: np.ndarray,
                           fixed: np.ndarray, *, max_ratio: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """Empirical-Bayes shrinkage of the measured interactions towards independence (opt-in).

    Each noisy residual ``r^_A`` of order ``k >= 2`` is an unbiased estimate of ``c_A`` with
    variance ``1/W_A`` per coordinate. Put a normal prior on ``c_A`` centred at the residual of
    the product of the fitted one-way marginals, ``c0_A = N^{1-k} ⊗_{a ∈ A} c_a`` (equation (5)
    with every attribute its own group), with one variance ``tau_k²`` per order, estimated by
    the method of moments (James and Stein 1961; Efron and Morris 1973)::

        tau_k²  =  max(mean (r^_A - c0_A)²  -  mean 1/W_A,  0)                            (6)

    (means over the coordinates of the noisy residuals of order ``k``). The posterior mode is
    the minimiser of ``W_A ||c_A - r^_A||² + P_k ||c_A - c0_A||²`` with ``P_k = 1/tau_k²``, i.e. a
    least-squares term of weight ``W_A + P_k`` around ``(W_A r^_A + P_k c0_A) / (W_A + P_k)``:
    the projection then solves the same problem (4) with these targets and weights. ``P_k`` is
    capped at ``max_ratio * W_A`` (at most that much shrinkage; it keeps the dual's conditioning).

    Returns ``(target, weight, info)``; ``info`` has ``tau2`` and the mean shrinkage factor
    ``P / (W + P)`` per order.
    """
    order = index.set_order
    one_way = measured & (order <= 1)
    centre = independence_prior(index, target, one_way)  # every set of order >= 2: the product of one-ways
    target, weight = target.copy(), weight.copy()
    info: dict = {}
    for k in range(2, int(order.max(initial=0)) + 1):
        sets = np.flatnonzero((order == k) & measured & ~fixed & (weight > 0) & (index.set_cells > 0))
        if not sets.size:
            continue
        chosen = np.zeros(index.num_sets, dtype=bool)
        chosen[sets] = True
        coords = index.per_set(chosen) > 0
        w_flat = index.per_set(weight)[coords]
        spread = float(np.mean((target[coords] - centre[coords]) ** 2))
        tau2 = max(spread - float(np.mean(1.0 / w_flat)), 0.0)
        prior = np.minimum(1.0 / tau2 if tau2 > 0 else np.inf, max_ratio * weight[sets])
        per_set = np.zeros(index.num_sets)
        per_set[sets] = prior
        p_flat = index.per_set(per_set)[coords]
        target[coords] = (w_flat * target[coords] + p_flat * centre[coords]) / (w_flat + p_flat)
        weight[sets] = weight[sets] + prior
        info[k] = {"tau2": tau2, "shrinkage": float(np.mean(p_flat / (w_flat + p_flat)))}
    return target, weight, info
