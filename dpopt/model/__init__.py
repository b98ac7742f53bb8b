"""The shared model: domains, data, linear queries, measurements and public constraints.

Everything here is public and data-independent except :class:`Dataset`, which holds the
confidential records (only the privacy layer reads it to answer queries).
"""

from dpopt.model.constraints import (
    ConstraintSet,
    Hierarchy,
    Integrality,
    Invariant,
    LinearInequality,
    NonNegativity,
    StructuralZeros,
)
from dpopt.model.data import Dataset, cells_frame
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries import (
    Identity,
    LinearQuery,
    Marginal,
    MarginalWorkload,
    SelectedRows,
    Total,
    WorkloadEvaluator,
    all_marginals,
)

__all__ = [
    "Domain", "Dataset", "cells_frame", "Measurement", "ConstraintSet", "NonNegativity", "Integrality",
    "StructuralZeros", "Hierarchy", "Invariant", "LinearInequality", "LinearQuery", "Identity", "Total",
    "Marginal", "MarginalWorkload", "SelectedRows", "WorkloadEvaluator", "all_marginals",
]
