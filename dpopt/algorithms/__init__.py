"""dpopt algorithms: registered plans of measurement plus consistency over the shared model.

Every algorithm is an :class:`~dpopt.algorithms.base.Algorithm` in :data:`REGISTRY`: ``plan(domain,
constraints, budget)`` says what it will measure and with which noise, without data; ``run(plan,
data, accountant, rng)`` returns one :class:`~dpopt.algorithms.base.Release`.

The built-in algorithms are imported at first use (:data:`~dpopt.algorithms.base.BUILTIN_MODULES`):
:func:`get_algorithm` imports the module of the one asked for, and the names below (``MWEM``,
``TopDown``, ...) import theirs when first read; reading :data:`REGISTRY` from this package, or
:func:`registered_names`, imports every one. (``mwem`` and ``dualquery`` are imported here: each
module shares its name with the function this package exports.)
"""

from __future__ import annotations

import importlib

from dpopt.algorithms.base import (
    BUILTIN_MODULES,
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
from dpopt.algorithms.mwem import MWEM, MWEMParams, MWEMResult, mwem

#: Each lazily exported name and the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Auto", "AutoParams"), "dpopt.algorithms.auto"),
    **dict.fromkeys(("Barak", "BarakParams", "BarakRelease", "FourierPlan", "barak_release", "fourier_consistency",
                     "fourier_plan", "measure_fourier"), "dpopt.algorithms.barak"),
    **dict.fromkeys(("MarginalSpace", "MarginalSpaceParams"), "dpopt.algorithms.marginal_space"),
    **dict.fromkeys(("MatrixMechanism", "MatrixMechanismParams", "WorkloadSpec"), "dpopt.algorithms.matrix_mechanism"),
    **dict.fromkeys(("MeasureReconstruct", "MeasureReconstructParams"), "dpopt.algorithms.measure_reconstruct"),
    **dict.fromkeys(("FactoredMWEMResult", "factored_mwem"), "dpopt.algorithms.mwem_factored"),
    **dict.fromkeys(("Polynomial", "PolynomialParams", "PolynomialRelease"), "dpopt.algorithms.polynomial"),
    **dict.fromkeys(("TopDown", "TopDownParams", "TopDownRelease"), "dpopt.algorithms.topdown"),
}

__all__ = [
    "REGISTRY", "Algorithm", "AlgorithmParams", "AlgorithmPlan", "PlannedMeasure", "Release", "get_algorithm",
    "register", "registered_names", "BUILTIN_MODULES",
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


def __getattr__(name: str):
    if name == "REGISTRY":  # the whole registry: every built-in algorithm loaded
        from dpopt.algorithms import base

        registered_names()
        return base.REGISTRY
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpopt.algorithms' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
