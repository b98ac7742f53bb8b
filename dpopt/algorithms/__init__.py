"""dpopt."""

from dpopt.algorithms.mwem import MWEMResult, SelectedRows, WorkloadEvaluator, mwem  # noqa: E402
