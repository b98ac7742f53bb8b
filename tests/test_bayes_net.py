"""The sparse Bayesian network of the wide-data benchmarks: exact marginals against enumeration."""

from itertools import product

import numpy as np
import pytest

from dpopt.datasets.bayes_net import random_sparse_network
from dpopt.errors import ParameterError


def test_exact_marginals_match_enumeration_and_samples():
    net = random_sparse_network(8, seed=3, window=3, max_parents=2)
    assert all(0 < len(p) <= 2 and all(i - 3 <= q < i for q in p) for i, p in enumerate(net.parents) if i)
    states = np.array(list(product([0, 1], repeat=8)))
    prob = np.ones(len(states))
    for i in range(8):
        p1 = net.probability_one(i, states[:, list(net.parents[i])])
        prob *= np.where(states[:, i] == 1, p1, 1 - p1)
    for k in (1, 2, 3):
        combos, cells = net.marginals(k)
        weights = 2 ** np.arange(k)[::-1]
        brute = np.stack([np.bincount(states[:, c] @ weights, weights=prob, minlength=2**k) for c in combos])
        np.testing.assert_allclose(cells, brute, atol=1e-12)
    data = net.sample(40000, 1)
    _, cells = net.marginals(2)
    assert np.abs(data.binary_marginal_counts(2) / 40000 - cells).max() < 0.02


def test_bad_parameters():
    with pytest.raises(ParameterError):
        random_sparse_network(0)
    with pytest.raises(ParameterError):
        random_sparse_network(5, window=2, max_parents=3)
