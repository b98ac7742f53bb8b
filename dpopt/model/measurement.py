"""A noisy measurement: the only object that crosses from the private side to post-processing.

``y = Q x + z``, where ``Q`` is a :class:`~dpopt.model.queries.base.LinearQuery`, ``x`` the
private histogram and ``z`` noise of a known law (family and scale, hence variance). The
privacy cost that paid for it is recorded with it, so every estimate can say what it cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpopt.errors import QueryError
from dpopt.model.queries.base import LinearQuery

#: Noise families a measurement may carry.
NOISE_FAMILIES = (
    "discrete_laplace",
    "discrete_gaussian",
    "laplace",
    "gaussian",
    "derived",
    "none",
)


@dataclass(frozen=True, eq=False)
class Measurement:
    """Noisy answers to a linear query.

    Parameters
    ----------
    query : LinearQuery
        The measured operator ``Q`` (shape ``(m, n)``).
    values : ndarray, shape (m,)
        The noisy answers ``y``, in the units of ``query``.
    noise : str
        One of :data:`NOISE_FAMILIES`; ``"none"`` for exact public values and for tests;
        ``"derived"`` for answers post-processed from other measurements (a linear
        combination of independent noisy answers: only its ``variance`` is meaningful, and
        ``scale`` is its standard deviation).
    scale : float
        Laplace scale ``b`` or Gaussian ``sigma``, in the units of ``query``.
    variance : float
        Variance of each noise entry (for discrete noise, the exact variance of the
        discrete law, not the continuous approximation).
    cost : object, optional
        The :class:`~dpopt.privacy.accountant.PrivacyCost` charged for it.
    label : str
        Name used in reports and residual listings.
    info : dict
        Anything else a mechanism records (grid, sensitivity, mechanism name).
    """

    query: LinearQuery
    values: np.ndarray
    noise: str
    scale: float
    variance: float
    cost: Any = None
    label: str = "measurement"
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        values = np.asarray(self.values, dtype=np.float64)
        if values.shape != (self.query.num_rows,):
            raise QueryError(
                f"measurement {self.label!r}: {values.shape} answers for a query with "
                f"{self.query.num_rows} rows"
            )
        if not np.isfinite(values).all():
            raise QueryError(f"measurement {self.label!r}: answers must be finite")
        if self.noise not in NOISE_FAMILIES:
            raise QueryError(f"measurement {self.label!r}: unknown noise family {self.noise!r}")
        if not (np.isfinite(self.variance) and self.variance >= 0):
            raise QueryError(f"measurement {self.label!r}: variance must be finite and >= 0")
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    @property
    def domain(self):
        return self.query.domain

    @property
    def stddev(self) -> float:
        return float(np.sqrt(self.variance))

    @property
    def weight(self) -> float:
        """Least-squares weight ``1 / sigma^2`` (inf for exact measurements)."""
        return float("inf") if self.variance == 0 else 1.0 / self.variance

    def residuals(self, x: np.ndarray) -> np.ndarray:
        """``Q x - y``."""
        return self.query.matvec(x) - self.values

    def standardized_residuals(self, x: np.ndarray) -> np.ndarray:
        """``(Q x - y) / sigma``; NaN for exact measurements."""
        r = self.residuals(x)
        return r / self.stddev if self.variance > 0 else np.full_like(r, np.nan)

    @classmethod
    def exact(cls, query: LinearQuery, values: np.ndarray, label: str = "exact") -> "Measurement":
        """A noise-free measurement (public values, or tests with noise turned off)."""
        return cls(query, values, "none", 0.0, 0.0, None, label)

    def __repr__(self) -> str:
        return (
            f"Measurement({self.label!r}, {self.query.name}, m={self.query.num_rows}, "
            f"noise={self.noise}, scale={self.scale:.4g})"
        )
