"""dpopt algorithms: registered plans of measurement plus consistency over the shared model.

Every algorithm is an :class:`~dpopt.algorithms.base.Algorithm` in :data:`REGISTRY`
(importing this package registers the built-in ones): ``plan(domain, constraints, budget)``
says what it will measure and with which noise, without data; ``run(plan, data, accountant,
rng)`` returns one :class:`~dpopt.algorithms.base.Release`.
"""

from dpopt.algorithms.auto import Auto, AutoParams
from dpopt.algorithms.barak import (
    Barak,
    BarakParams,
    BarakRelease,
    FourierPlan,
    barak_release,
    fourier_consistency,
    fourier_plan,
    measure_fourier,
)
from dpopt.algorithms.base import (
    REGISTRY,
    Algorithm,
    AlgorithmParams,
    AlgorithmPlan,
    PlannedMeasure,
    Release,
    get_algorithm,
    register,
    registered_names,
)
from dpopt.algorithms.dualquery import DualQuery, DualQueryParams, dualquery
from dpopt.algorithms.marginal_space import MarginalSpace, MarginalSpaceParams
from dpopt.algorithms.matrix_mechanism import MatrixMechanism, MatrixMechanismParams, WorkloadSpec
from dpopt.algorithms.measure_reconstruct import MeasureReconstruct, MeasureReconstructParams
from dpopt.algorithms.mwem import MWEM, MWEMParams, MWEMResult, mwem
from dpopt.algorithms.mwem_factored import FactoredMWEMResult, factored_mwem
from dpopt.algorithms.polynomial import Polynomial, PolynomialParams, PolynomialRelease
from dpopt.algorithms.topdown import TopDown, TopDownParams, TopDownRelease

__all__ = [
    "REGISTRY", "Algorithm", "AlgorithmParams", "AlgorithmPlan", "PlannedMeasure", "Release", "get_algorithm",
    "register", "registered_names",
    "MeasureReconstruct", "MeasureReconstructParams",
    "Auto", "AutoParams",
    "Barak", "BarakParams", "BarakRelease", "FourierPlan", "barak_release", "fourier_consistency", "fourier_plan",
    "measure_fourier",
    "MWEM", "MWEMParams", "MWEMResult", "mwem",
    "FactoredMWEMResult", "factored_mwem",
    "Polynomial", "PolynomialParams", "PolynomialRelease",
    "DualQuery", "DualQueryParams", "dualquery",
    "MarginalSpace", "MarginalSpaceParams",
    "MatrixMechanism", "MatrixMechanismParams", "WorkloadSpec",
    "TopDown", "TopDownParams", "TopDownRelease",
]
