"""A least-squares fit ``auto`` makes under zCDP, for the tests of its face and its polish: the
residuals up to order 2 of a sparse table's noisy histogram, as one derived measurement."""

from __future__ import annotations

import numpy as np

from dpopt.estimate.choice.statistics import residual_statistics
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import Identity


def sparse_residual_case(d: int, seed: int):
    """``(domain, Q, v, offset, w0)``: ``d`` binary attributes, half the cells empty, Gaussian noise
    of s.d. 4 on the histogram; ``Q`` the residual query (orders <= 2) and ``v`` its answers, with
    the total's row at ``offset`` and weight ``w0`` (the total's estimate is ``v[offset] / w0``)."""
    dom = Domain.from_dict({f"a{i}": 2 for i in range(d)})
    gen = np.random.default_rng(seed)  # test input and test noise
    x = gen.integers(0, 8, dom.size).astype(float)
    x[: dom.size // 2] = 0.0
    y = x + gen.normal(0, 4.0, dom.size)
    stats = residual_statistics([Measurement(Identity(dom), y, "gaussian", 4.0, 16.0)])
    meas = stats.measurement([a for a in stats.sets if len(a) <= 2])
    q, v = meas.query, np.asarray(meas.values, dtype=np.float64)
    i0 = list(q.sets).index(())
    return dom, q, v, int(q.offsets[i0]), float(q.weights[i0])
