"""Top-down release over a geography hierarchy (the 2020 US Census TopDown algorithm).

Abowd et al. (2022): the units of each level (nation → state → county → ...) are measured
with exact noise, and level by level, root first, each parent's children are solved jointly so
that they add up to the parent's released table cell by cell, keep the invariants and the
structural zeros, and are non-negative integers; a failsafe relaxes a parent that leaves its
children no solution, and says so. Children of different parents are independent problems,
solved by a local process pool or on Spark.

Modules: :mod:`~dpopt.algorithms.topdown.algorithm` (the registered algorithm, its spec tables
and plan), :mod:`~dpopt.algorithms.topdown.engine` (measure and solve, level by level),
:mod:`~dpopt.algorithms.topdown.solve` (one parent's problem, through the engines),
:mod:`~dpopt.algorithms.topdown.constraints` (invariants and zeros per unit),
:mod:`~dpopt.algorithms.topdown.executors` (serial, process pool, Spark),
:mod:`~dpopt.algorithms.topdown.readers` (unit histograms from files, pandas or Spark),
:mod:`~dpopt.algorithms.topdown.evaluate` (errors by level and unit size; NOT private).
"""

from dpopt.algorithms.topdown.algorithm import (
    GeographySpec,
    LevelMeasure,
    TopDown,
    TopDownParams,
    TopDownPlan,
    TopDownRelease,
)
from dpopt.algorithms.topdown.constraints import UnitInvariant, ZeroRules
from dpopt.algorithms.topdown.executors import PoolExecutor, SerialExecutor, SparkExecutor, make_executor
from dpopt.algorithms.topdown.solve import ParentSolution, ParentTask, solve_parent

__all__ = [
    "TopDown", "TopDownParams", "TopDownPlan", "TopDownRelease", "GeographySpec", "LevelMeasure", "UnitInvariant",
    "ZeroRules", "PoolExecutor", "SerialExecutor", "SparkExecutor", "make_executor", "ParentTask", "ParentSolution",
    "solve_parent",
]
