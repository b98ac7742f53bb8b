"""The release pipeline behind ``dpopt run``, on the algorithm registry.

:mod:`~dpopt.release.plan` builds and checks the public objects (no data);
:mod:`~dpopt.release.pipeline` reads the data, adds the invariants published from it and runs
the spec's registered :class:`~dpopt.algorithms.base.Algorithm`; :mod:`~dpopt.release.outputs`
builds and writes what is published; :mod:`~dpopt.release.evaluate` compares a release with the
confidential data (NOT private); :mod:`~dpopt.release.resources` estimates the memory a plan
needs. Nothing here branches on an algorithm's name.
"""

from dpopt.release.evaluate import evaluate_release
from dpopt.release.outputs import (
    ReleaseResult,
    read_released,
    released_counts,
    released_marginals,
    released_table,
    slug,
    synthesize,
    write_release,
)
from dpopt.release.pipeline import (
    NotPrivateWarning,
    build_constraints,
    load_data,
    measure,
    reconstruct_table,
    run,
    run_algorithm,
)
from dpopt.release.plan import PlannedMeasure, ReleasePlan, plan
from dpopt.release.resources import MemoryEstimate, ResourceLimitError, estimate_memory
from dpopt.spec import load_spec

__all__ = [
    "ReleasePlan", "PlannedMeasure", "ReleaseResult", "load_spec", "plan", "load_data", "build_constraints",
    "run_algorithm", "measure", "reconstruct_table", "released_counts", "released_table", "released_marginals",
    "synthesize", "evaluate_release", "write_release", "slug", "run", "read_released", "NotPrivateWarning",
    "MemoryEstimate", "ResourceLimitError", "estimate_memory",
]
