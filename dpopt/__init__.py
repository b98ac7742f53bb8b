"""dpopt: differentially private data release as noisy measurement plus consistency optimization.

The names below are loaded on first use (``import dpopt`` stays light)::

    import dpopt
    release = dpopt.run("quickstart", seed=1)          # seeded: NOT private
    dpopt.REGISTRY                                     # the registered algorithms
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "run": "dpopt.release", "plan": "dpopt.release", "load_spec": "dpopt.spec",
    "Release": "dpopt.algorithms", "Algorithm": "dpopt.algorithms", "REGISTRY": "dpopt.algorithms",
    "register": "dpopt.algorithms", "get_algorithm": "dpopt.algorithms",
    "Budget": "dpopt.privacy", "Accountant": "dpopt.privacy", "make_random": "dpopt.privacy",
    "Domain": "dpopt.model", "Dataset": "dpopt.model", "ConstraintSet": "dpopt.model",
    "reconstruct": "dpopt.estimate", "round_to_integers": "dpopt.estimate", "Status": "dpopt.estimate",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dpopt' has no attribute {name!r}")
