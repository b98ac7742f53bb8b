"""Consistent marginals past the dense table: estimation in marginal space.

From noisy marginals (any attribute sets, any accounting) to the consistent, non-negative
marginals of a workload that fit them best, without ever forming the full table:

- :func:`estimate_marginals` — the one call (Measurements of marginals in; consistent
  marginals, ``.marginals()``, and a record sampler, ``.records()``, out): residual-basis least
  squares (one inverse-variance average per residual, :mod:`.gls`; unmeasured residuals centred
  by the independence prior of :mod:`.prior`), then non-negativity and structural zeros by the dual of the
  least-squares projection over the local marginal polytope (:mod:`.polytope`), certified
  by its duality gap; returns a :class:`MarginalEstimate`;
- ``estimate_marginals(..., objective="smooth")`` — the dense smooth (entropy-regularised)
  estimate computed exactly by message passing on a junction tree of the measured sets
  (:mod:`.graphical`: :mod:`.graphical.smooth`, :mod:`.graphical.junction_tree`), where that
  tree fits; the default
  ``objective="auto"`` takes it by :func:`choose_objective`'s rule (public quantities only: no
  constraint it cannot keep, and a tree of at most :data:`SMOOTH_TREE_CELLS` cells), least
  squares otherwise;
- :func:`synthetic_records` — records drawn (from uniforms the caller passes) from a
  Bayesian network fitted to the estimate, with controlled rounding along the network so
  that its families' marginals are kept to within a record.

Parts: :mod:`.layout` (residuals and marginals held set by set), :mod:`.gls`, :mod:`.prior`,
:mod:`.total`, :mod:`.polytope` (the projection and its certificate: projection, augmented
Lagrangian, face finish, interior point), :mod:`.estimator`, :mod:`.result`, :mod:`.sampling`,
:mod:`.graphical` (the junction tree and the smooth estimate on it).
Pure post-processing: no data, no randomness of its own.
"""

from dpopt.estimate.marginal_space.estimator import (
    EXACT_CELLS,
    MAX_CLIQUE_CELLS,
    PRIOR_RATIO,
    SMOOTH_TREE_CELLS,
    choose_objective,
    estimate_marginals,
    marginal_sets,
)
from dpopt.estimate.marginal_space.result import MarginalEstimate, MarginalFrameMap

__all__ = ["estimate_marginals", "choose_objective", "marginal_sets", "MarginalEstimate", "MarginalFrameMap",
           "PRIOR_RATIO", "MAX_CLIQUE_CELLS", "EXACT_CELLS", "SMOOTH_TREE_CELLS"]
