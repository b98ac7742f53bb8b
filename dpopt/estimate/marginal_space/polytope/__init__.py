"""The least-squares projection over the local marginal polytope, and its certificate.

Step 4 of :func:`~dpopt.estimate.marginal_space.estimate_marginals`: the residual fit made
non-negative and consistent (structural zeros kept), solved through its dual and released only
with a duality-gap certificate. Parts:

- :mod:`.projection` — problem (4), its dual, the certificate (a repaired primal point paired with
  the multipliers) and the active-face polish;
- :mod:`.admm` — the solver for large cyclic families (one expand and one adjoint a step);
- :mod:`.anderson` — Anderson acceleration of ADMM's fixed-point map;
- :mod:`.local_repair` — each clique's own top residual lifts its negative cells (moves that keep
  every lower margin), before the records;
- :mod:`.records` — a feasible point by adding records, the certificate's repair near the data;
- :mod:`.augmented_lagrangian` — the earlier solver for large cyclic families (semismooth Newton
  inner solves; ``project(..., alm=True)``);
- :mod:`.face_finish` — a feasible point on the dual's active face, when the repair alone leaves
  the gap open;
- :mod:`.interior` — a strictly positive point of the constraints, the repair's target.
"""
