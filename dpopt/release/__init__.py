"""The release pipeline behind ``dpopt run``, on the algorithm registry.

:mod:`~dpopt.release.plan` builds and checks the public objects (no data);
:mod:`~dpopt.release.pipeline` reads the data, adds the invariants published from it and runs
the spec's registered :class:`~dpopt.algorithms.base.Algorithm`; :mod:`~dpopt.release.outputs`
builds and writes what is published; :mod:`~dpopt.release.evaluate` compares a release with the
confidential data (NOT private); :mod:`~dpopt.release.resources` estimates the memory a plan
needs. Nothing here branches on an algorithm's name.
"""

from __future__ import annotations

import importlib

# The plan now (`dpopt.release.plan` must stay the function, not its module, whatever is imported
# later); the rest on first use: `dpopt check` needs neither the outputs, the report nor the pipeline.
from dpopt.release.plan import PlannedMeasure, ReleasePlan, plan

_EXPORTS = {
    "evaluate_release": "dpopt.release.evaluate",
    **dict.fromkeys(("ReleaseResult", "read_released", "released_counts", "released_marginals", "released_table",
                     "slug", "synthesize", "write_release"), "dpopt.release.outputs"),
    **dict.fromkeys(("NotPrivateWarning", "build_constraints", "load_data", "measure", "reconstruct_table", "run",
                     "run_algorithm"), "dpopt.release.pipeline"),
    **dict.fromkeys(("MemoryEstimate", "ResourceLimitError", "estimate_memory"), "dpopt.release.resources"),
    "load_spec": "dpopt.spec",
}

__all__ = [
    "ReleasePlan", "PlannedMeasure", "ReleaseResult", "load_spec", "plan", "load_data", "build_constraints",
    "run_algorithm", "measure", "reconstruct_table", "released_counts", "released_table", "released_marginals",
    "synthesize", "evaluate_release", "write_release", "slug", "run", "read_released", "NotPrivateWarning",
    "MemoryEstimate", "ResourceLimitError", "estimate_memory",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dpopt.release' has no attribute {name!r}")
