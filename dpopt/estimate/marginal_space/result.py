"""The marginal-space estimate: consistent marginals held as residuals, read on demand.

An ``OptimizeResult`` in dpopt's style: ``status``, ``success``, ``message``, ``fun`` (the
weighted sum of squared residuals of the measurements, dpopt's L2 objective), ``nit``,
``time``, ``info`` (the certificate, sizes, timings). Any marginal inside one of the cliques is
read from the residuals by equation (1) of :mod:`~dpopt.estimate.marginal_space.layout`; all
such marginals are consistent with each other and non-negative.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeResult

from dpopt.errors import QueryError

__all__ = ["MarginalEstimate", "MarginalFrameMap"]


class MarginalEstimate(OptimizeResult):
    """Outcome of :func:`~dpopt.estimate.marginal_space.estimate_marginals`.

    Attributes
    ----------
    status : Status
        OPTIMAL only when the certificate holds; TIME_LIMIT / NUMERICAL_ERROR otherwise (the
        point is then an incumbent: ``success`` False, never to be released).
    success : bool
    message : str
    fun : float
        ``sum_S ||y_S - mu_S||² / sigma_S²`` over the noisy measurements.
    domain : Domain
    workload : tuple of tuple of str
        The marginals released (default: the measured sets).
    cliques : tuple of tuple of str
        The largest sets held (workload, measured and constraint sets not inside another).
    total : float
        The estimate's record count.
    residuals : ndarray
        The residuals (flat, :class:`~dpopt.estimate.marginal_space.layout.ResidualIndex` layout).
    table : ndarray or None
        The full table when the domain was small enough to be solved as one
        (``info["polytope"] == "table"``); None otherwise.
    info : dict
        ``certificate`` (relative duality gap, largest violation, their tolerances, primal and
        dual values), sizes (``cliques``, ``clique_cells``, ``residual_sets``, ...), timings.
    """

    # ---- reading marginals ------------------------------------------------------------------
    def _axes(self, attrs: Sequence[str]) -> tuple[int, ...]:
        if isinstance(attrs, str):
            attrs = (attrs,)
        attrs = tuple(attrs)
        axes = tuple(sorted(self.domain.axes(self.domain.check_attrs(attrs)))) if attrs else ()
        if len(set(axes)) != len(axes):
            raise QueryError(f"marginal over {list(attrs)} names an attribute twice")
        try:
            self.index.position_of(axes)
        except QueryError:
            raise QueryError(f"the marginal over {list(attrs)} is not inside any estimated marginal "
                             f"(the cliques are {_preview(self.cliques)}); add it to the workload") from None
        return axes

    def marginal(self, attrs: Sequence[str]) -> np.ndarray:
        """Counts of the marginal over ``attrs`` (flat, C order over the attributes in domain order).

        Any set inside a clique may be read (subsets of workload marginals included), all
        consistent with each other.
        """
        from dpopt.estimate.marginal_space.layout import SetFamily

        if self.get("table") is not None:  # solved as a table: any marginal of it
            from dpopt.model.queries.marginal import Marginal

            attrs = self.domain.canonical((attrs,) if isinstance(attrs, str) else attrs)
            return Marginal(self.domain, attrs).matvec(self.table) if attrs else np.array([self.table.sum()])
        axes = self._axes(attrs)
        return SetFamily(self.index, [axes]).expand(self.residuals)

    def marginals(self, sets: Sequence[Sequence[str]] | None = None) -> dict[tuple[str, ...], np.ndarray]:
        """``{attrs: counts}`` for ``sets`` (default: the workload), computed together."""
        from dpopt.estimate.marginal_space.layout import SetFamily

        sets = self.workload if sets is None else [tuple(self.domain.canonical(s)) for s in sets]
        if self.get("table") is not None:
            return {tuple(s): self.marginal(s) for s in sets}
        axes = [self._axes(s) for s in sets]
        family = SetFamily(self.index, axes)
        flat = family.expand(self.residuals)
        return {tuple(s): family.marginal(flat, i).copy() for i, s in enumerate(sets)}

    def answer(self, query) -> np.ndarray:
        """A :class:`Marginal` or :class:`Total` query's answers on the estimate."""
        from dpopt.estimate.marginal_space.estimator import marginal_sets
        from dpopt.model.measurement import Measurement

        (attrs,) = marginal_sets([Measurement.exact(query, np.zeros(query.num_rows), "query")], "query")
        return self.marginal(attrs) if attrs else np.array([self.total])

    # ---- records ------------------------------------------------------------------------------
    def records(self, n: int | None = None, *, uniforms=None, rng=None, **options) -> np.ndarray:
        """Codes ``(n, d)`` of synthetic records whose marginals follow the estimate
        (:func:`~dpopt.estimate.marginal_space.sampling.synthetic_records`)."""
        from dpopt.estimate.marginal_space.sampling import synthetic_records

        return synthetic_records(self, n, uniforms=uniforms, rng=rng, **options)

    def __repr__(self) -> str:
        return (f"MarginalEstimate(status={self.status.name}, {len(self.workload)} marginals over "
                f"{len(self.domain)} attributes, total {self.total:.6g})")

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.keys()))


class MarginalFrameMap(Mapping):
    """Marginals as ``"a, b" -> DataFrame`` built on access by ``frame_of(attrs)`` (thousands of
    marginals cost nothing until read); ``extra`` frames follow under their own labels. The
    release layer gives the labelled frames (``dpopt.algorithms.marginal_space``)."""

    def __init__(self, frame_of, sets, extra: Mapping | None = None, cells_of=None) -> None:
        self._frame_of = frame_of
        self._cells_of = cells_of
        self._keys = {", ".join(s): tuple(s) for s in sets}
        self._frames: dict[str, pd.DataFrame] = dict(extra or {})
        self._order = list(self._keys) + [k for k in (extra or {}) if k not in self._keys]

    def __getitem__(self, key: str) -> pd.DataFrame:
        frame = self._frames.get(key)
        if frame is None:
            if key not in self._keys:
                raise KeyError(key)
            frame = self._frames[key] = self._frame_of(self._keys[key])
        return frame

    def __iter__(self):
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def rows(self, key: str) -> int:
        """Rows of the frame under ``key``, without building it when ``cells_of`` was given."""
        if self._cells_of is not None and key in self._keys and key not in self._frames:
            return int(self._cells_of(self._keys[key]))
        return len(self[key])

    def __repr__(self) -> str:
        return f"MarginalFrameMap({len(self)} marginals)"


def _preview(sets, k: int = 4) -> str:
    shown = "; ".join("(" + ", ".join(s) + ")" for s in sets[:k])
    return shown + ("; ..." if len(sets) > k else "")
