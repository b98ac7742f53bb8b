"""The graphical-model side of marginal space: a junction tree over the measured sets, and the
smooth (entropy-regularised) estimate computed exactly on it.

``estimate_marginals(..., objective="smooth")`` (or ``"auto"``, by
:func:`~dpopt.estimate.marginal_space.estimator.choose_objective`'s rule) lands here. Parts:

- :mod:`.junction_tree` — the tree over attribute sets, log-domain sum-product and its
  forward-mode derivative, and batched reads of sets no clique holds;
- :mod:`.smooth` — the dense smooth engine's ``K`` Bregman proximal steps by message passing,
  its prior (per attribute, from the noisy one-way answers) and its certificate.
"""
