"""dpopt algorithms: plans of measurement plus consistency over the shared model."""

from dpopt.algorithms.barak import (
    BarakRelease,
    FourierPlan,
    barak_release,
    fourier_consistency,
    fourier_plan,
    measure_fourier,
)
from dpopt.algorithms.matrix_mechanism import MatrixMechanism
from dpopt.algorithms.mwem_factored import FactoredMWEMResult, factored_mwem

__all__ = [
    "BarakRelease", "FourierPlan", "barak_release", "fourier_consistency", "fourier_plan", "measure_fourier",
    "FactoredMWEMResult", "factored_mwem", "MatrixMechanism",
]
