"""Canonical mathematical-programming forms that the solver backends consume.

The consistency layer compiles a problem (measurements, constraints, an L1/L2/L∞/entropy
objective) into one of two forms, and :mod:`dpopt.estimate.backends` solves them:

* :class:`ProgramForm` — a sparse LP / QP / MILP / MIQP in a single canonical form::

      minimise    cᵀv + ½ vᵀPv + c0
      subject to  row_lower ≤ A v ≤ row_upper     (equalities as equal bounds, ±inf allowed)
                  lower ≤ v ≤ upper
                  v_j integer where integrality[j]

  the same "bounded rows, bounded columns" form HiGHS uses, so it maps to every backend
  without reformulation (cvxpy's separation of problem meaning from solver I/O).

* :class:`LeastSquaresForm` — the weighted L2 objective at scale, with bounds only::

      minimise    ‖D (M v − y)‖²        subject to  lower ≤ v ≤ upper

  with ``M`` sparse or matrix-free (a ``scipy.sparse.linalg.LinearOperator``), solved by
  bounded least-squares methods that never form ``MᵀM``.

Both forms validate their inputs on construction; a malformed field raises
:class:`FormError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, aslinearoperator

from dpopt.errors import SolverError

__all__ = ["FormError", "ProgramForm", "LeastSquaresForm", "constraint_group"]


class FormError(SolverError, ValueError):
    """A program form is malformed (wrong shape, NaN, crossed bounds). The message names the field."""


def constraint_group(row_name: str) -> str:
    """The constraint group of a row: its name up to the first ``"["``.

    ``"invariant:state_totals[3]"`` belongs to group ``"invariant:state_totals"``; a name
    without brackets is its own group.
    """
    return row_name.split("[", 1)[0]


def _vector(name: str, value, n: int, *, allow_inf: bool, default: float | None = None) -> np.ndarray:
    """A float vector of length ``n`` (a scalar is broadcast), checked for NaN and inf."""
    if value is None:
        if default is None:
            raise FormError(f"{name} is required")
        value = default
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise FormError(f"{name} must be numeric: {exc}") from exc
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise FormError(f"{name} must have shape ({n},), got {arr.shape}")
    if np.isnan(arr).any():
        raise FormError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}")
    if not allow_inf and np.isinf(arr).any():
        raise FormError(f"{name} must be finite; inf at index {int(np.flatnonzero(np.isinf(arr))[0])}")
    arr.setflags(write=False)
    return arr


def _check_bounds(lower_name: str, lower: np.ndarray, upper_name: str, upper: np.ndarray) -> None:
    crossed = np.flatnonzero(lower > upper)
    if crossed.size:
        i = int(crossed[0])
        raise FormError(
            f"{lower_name}[{i}] = {lower[i]} exceeds {upper_name}[{i}] = {upper[i]} "
            f"({crossed.size} crossed bound(s))"
        )
    if np.isposinf(lower).any():
        raise FormError(f"{lower_name} contains +inf at index {int(np.flatnonzero(np.isposinf(lower))[0])}")
    if np.isneginf(upper).any():
        raise FormError(f"{upper_name} contains -inf at index {int(np.flatnonzero(np.isneginf(upper))[0])}")


def _sparse_matrix(name: str, value, fmt: str) -> sp.csr_array | sp.csc_array:
    """``value`` as a scipy sparse array in format ``fmt``, float64, finite."""
    try:
        mat = sp.csr_array(value) if fmt == "csr" else sp.csc_array(value)
        mat = mat.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise FormError(f"{name} must be convertible to a sparse matrix: {exc}") from exc
    if mat.ndim != 2:
        raise FormError(f"{name} must be two-dimensional, got {mat.ndim} dimensions")
    mat.sum_duplicates()
    if not np.isfinite(mat.data).all():
        raise FormError(f"{name} contains NaN or inf entries")
    return mat


@dataclass(frozen=True, eq=False)
class ProgramForm:
    """A sparse LP / QP / MILP / MIQP in canonical form (see the module docstring).

    Parameters
    ----------
    c : array_like, shape (n,)
        Linear objective.
    A : sparse matrix, shape (m, n)
        Constraint matrix (stored as ``scipy.sparse.csr_array``). ``m`` may be 0.
    row_lower, row_upper : array_like, shape (m,)
        Row bounds; ``-inf`` / ``+inf`` for a missing side, equal values for an equality.
    lower, upper : array_like, shape (n,), optional
        Variable bounds; default ``0`` and ``+inf`` (non-negative variables).
    P : sparse matrix, shape (n, n), optional
        Symmetric positive semidefinite Hessian of the quadratic term ``½ vᵀPv`` (stored
        as ``scipy.sparse.csc_array``). Symmetry is checked; semidefiniteness is the
        caller's promise (checking it costs a factorisation) — a non-convex ``P`` makes
        the solvers fail or report a numerical error.
    integrality : array_like of bool, shape (n,), optional
        True where the variable must be integer.
    c0 : float
        Constant objective offset.
    row_names : list of str, length m
        The name of the constraint every row comes from, e.g. ``"invariant:state_totals[3]"``.
        The part before the first ``"["`` is the constraint *group* used to report
        conflicts (:func:`dpopt.estimate.backends.find_conflicting_rows`).
    var_names : list of str, length n, optional
        Names of the variables (for diagnostics only).

    Raises
    ------
    FormError
        (a :class:`~dpopt.errors.SolverError` and a ``ValueError``) naming the field that
        has the wrong shape, a NaN, an infinite coefficient, or crossed bounds.
    """

    c: np.ndarray
    A: sp.csr_array
    row_lower: np.ndarray
    row_upper: np.ndarray
    row_names: list[str]
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    P: sp.csc_array | None = None
    integrality: np.ndarray | None = None
    c0: float = 0.0
    var_names: list[str] | None = None

    def __post_init__(self) -> None:
        c = _vector("c", self.c, np.size(self.c), allow_inf=False)
        n = c.shape[0]
        A = _sparse_matrix("A", self.A, "csr")
        if A.shape[1] != n:
            raise FormError(f"A must have {n} columns (the length of c), got shape {A.shape}")
        m = A.shape[0]
        row_lower = _vector("row_lower", self.row_lower, m, allow_inf=True)
        row_upper = _vector("row_upper", self.row_upper, m, allow_inf=True)
        _check_bounds("row_lower", row_lower, "row_upper", row_upper)
        lower = _vector("lower", self.lower, n, allow_inf=True, default=0.0)
        upper = _vector("upper", self.upper, n, allow_inf=True, default=np.inf)
        _check_bounds("lower", lower, "upper", upper)

        P = None
        if self.P is not None:
            P = _sparse_matrix("P", self.P, "csc")
            if P.shape != (n, n):
                raise FormError(f"P must have shape ({n}, {n}), got {P.shape}")
            asym = abs(P - P.T)
            scale = max(1.0, float(abs(P).max()) if P.nnz else 1.0)
            if asym.nnz and float(asym.max()) > 1e-10 * scale:
                raise FormError(f"P must be symmetric; |P - Pᵀ| reaches {float(asym.max()):.3g}")
            P.eliminate_zeros()
            if P.nnz == 0:
                P = None

        integrality = None
        if self.integrality is not None:
            integrality = np.asarray(self.integrality)
            if integrality.shape != (n,):
                raise FormError(f"integrality must have shape ({n},), got {integrality.shape}")
            if integrality.dtype != np.bool_:
                if not np.isin(integrality, (0, 1)).all():
                    raise FormError("integrality must be boolean (True where the variable is integer)")
                integrality = integrality.astype(bool)
            integrality = integrality.copy()
            integrality.setflags(write=False)
            if not integrality.any():
                integrality = None

        try:
            c0 = float(self.c0)
        except (TypeError, ValueError) as exc:
            raise FormError(f"c0 must be a number, got {self.c0!r}") from exc
        if not np.isfinite(c0):
            raise FormError(f"c0 must be finite, got {c0}")

        row_names = list(self.row_names)
        if len(row_names) != m:
            raise FormError(f"row_names must name all {m} rows of A, got {len(row_names)} names")
        if not all(isinstance(r, str) for r in row_names):
            raise FormError("row_names must be strings")
        var_names = None
        if self.var_names is not None:
            var_names = list(self.var_names)
            if len(var_names) != n:
                raise FormError(f"var_names must name all {n} variables, got {len(var_names)} names")

        for name, value in (
            ("c", c), ("A", A), ("row_lower", row_lower), ("row_upper", row_upper),
            ("lower", lower), ("upper", upper), ("P", P), ("integrality", integrality),
            ("c0", c0), ("row_names", row_names), ("var_names", var_names),
        ):
            object.__setattr__(self, name, value)

    # ---- shape and kind ------------------------------------------------------------
    @property
    def num_vars(self) -> int:
        """Number of variables ``n``."""
        return int(self.c.shape[0])

    @property
    def num_rows(self) -> int:
        """Number of constraint rows ``m``."""
        return int(self.A.shape[0])

    @property
    def is_integer(self) -> bool:
        """True when some variable is integer."""
        return self.integrality is not None

    @property
    def kind(self) -> str:
        """``"LP"``, ``"QP"``, ``"MILP"`` or ``"MIQP"``."""
        quad = self.P is not None
        if self.is_integer:
            return "MIQP" if quad else "MILP"
        return "QP" if quad else "LP"

    @property
    def groups(self) -> list[str]:
        """The distinct constraint groups of the rows, in order of first appearance."""
        return list(dict.fromkeys(constraint_group(r) for r in self.row_names))

    # ---- evaluation ----------------------------------------------------------------
    def objective(self, v: np.ndarray) -> float:
        """``cᵀv + ½ vᵀPv + c0`` at ``v``."""
        v = np.asarray(v, dtype=np.float64)
        val = float(self.c @ v) + self.c0
        if self.P is not None:
            val += 0.5 * float(v @ (self.P @ v))
        return val

    def max_violation(self, v: np.ndarray) -> float:
        """Largest violation of a row bound, a variable bound or integrality at ``v``."""
        v = np.asarray(v, dtype=np.float64)
        Av = self.A @ v
        viol = [0.0]
        if self.num_rows:
            viol.append(float(np.max(np.maximum(self.row_lower - Av, Av - self.row_upper))))
        if self.num_vars:
            viol.append(float(np.max(np.maximum(self.lower - v, v - self.upper))))
        if self.integrality is not None:
            vi = v[self.integrality]
            viol.append(float(np.max(np.abs(vi - np.round(vi)))))
        return max(viol)

    # ---- derived forms ---------------------------------------------------------------
    def restricted(self, keep_rows: np.ndarray, *, drop_bounds: bool = False) -> "ProgramForm":
        """The same variables with only the rows ``keep_rows`` (a boolean mask or indices).

        With ``drop_bounds`` the variable bounds become free (``±inf``); integrality is kept.
        """
        idx = np.arange(self.num_rows)[keep_rows]
        return ProgramForm(
            c=self.c, A=self.A[idx], row_lower=self.row_lower[idx], row_upper=self.row_upper[idx],
            row_names=[self.row_names[i] for i in idx],
            lower=np.full(self.num_vars, -np.inf) if drop_bounds else self.lower,
            upper=np.full(self.num_vars, np.inf) if drop_bounds else self.upper,
            P=self.P, integrality=self.integrality, c0=self.c0, var_names=self.var_names,
        )

    def feasibility(self) -> "ProgramForm":
        """The same constraints with a zero objective (a pure feasibility problem)."""
        return ProgramForm(
            c=np.zeros(self.num_vars), A=self.A, row_lower=self.row_lower, row_upper=self.row_upper,
            row_names=self.row_names, lower=self.lower, upper=self.upper, P=None,
            integrality=self.integrality, c0=0.0, var_names=self.var_names,
        )


MatrixLike = Union[sp.sparray, sp.spmatrix, np.ndarray, LinearOperator]


@dataclass(frozen=True, eq=False)
class LeastSquaresForm:
    """Weighted bounded least squares: minimise ``‖D (M v − y)‖²`` s.t. ``lower ≤ v ≤ upper``.

    The generalised-least-squares estimator of the consistency step under Gaussian or
    Laplace noise with known variances (weights ``d_i = 1/σ_i``); see design notes §2
    (TopDown's L2 step) and Li et al.'s matrix mechanism (``x̂ = A⁺y``, constrained).

    Parameters
    ----------
    M : sparse matrix, ndarray or LinearOperator, shape (k, n)
        Measurement matrix. A ``LinearOperator`` must implement ``rmatvec``.
    y : array_like, shape (k,)
        Noisy answers.
    weights : array_like, shape (k,), optional
        The diagonal ``D`` (non-negative, finite); default all ones.
    lower, upper : array_like, shape (n,), optional
        Variable bounds; default ``-inf`` / ``+inf`` (unconstrained).

    Raises
    ------
    FormError
        Naming the field with the wrong shape, a NaN, a negative weight or crossed bounds.
    """

    M: MatrixLike
    y: np.ndarray
    weights: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    var_names: list[str] | None = field(default=None)

    def __post_init__(self) -> None:
        M = self.M
        if isinstance(M, LinearOperator):
            pass
        elif sp.issparse(M):
            M = _sparse_matrix("M", M, "csr")
        else:
            try:
                M = np.asarray(M, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise FormError(f"M must be a sparse matrix, an array or a LinearOperator: {exc}") from exc
            if M.ndim != 2:
                raise FormError(f"M must be two-dimensional, got shape {M.shape}")
            if not np.isfinite(M).all():
                raise FormError("M contains NaN or inf entries")
        k, n = (int(s) for s in M.shape)
        y = _vector("y", self.y, k, allow_inf=False)
        weights = None
        if self.weights is not None:
            weights = _vector("weights", self.weights, k, allow_inf=False)
            if (weights < 0).any():
                i = int(np.flatnonzero(weights < 0)[0])
                raise FormError(f"weights must be non-negative; weights[{i}] = {weights[i]}")
        lower = _vector("lower", self.lower, n, allow_inf=True, default=-np.inf)
        upper = _vector("upper", self.upper, n, allow_inf=True, default=np.inf)
        _check_bounds("lower", lower, "upper", upper)
        var_names = None if self.var_names is None else list(self.var_names)
        if var_names is not None and len(var_names) != n:
            raise FormError(f"var_names must name all {n} variables, got {len(var_names)} names")
        for name, value in (("M", M), ("y", y), ("weights", weights), ("lower", lower),
                            ("upper", upper), ("var_names", var_names)):
            object.__setattr__(self, name, value)

    @property
    def num_vars(self) -> int:
        """Number of variables ``n``."""
        return int(self.M.shape[1])

    @property
    def num_residuals(self) -> int:
        """Number of measurements ``k``."""
        return int(self.M.shape[0])

    @property
    def kind(self) -> str:
        """``"LSQ"`` (bounded least squares)."""
        return "LSQ"

    @property
    def is_bounded(self) -> bool:
        """True when some variable bound is finite."""
        return bool(np.isfinite(self.lower).any() or np.isfinite(self.upper).any())

    @property
    def is_matrix_free(self) -> bool:
        """True when ``M`` is a ``LinearOperator`` (no explicit entries)."""
        return isinstance(self.M, LinearOperator)

    def weighted_operator(self) -> LinearOperator:
        """``D M`` as a LinearOperator (matrix-free)."""
        op = aslinearoperator(self.M)
        if self.weights is None:
            return op
        return aslinearoperator(sp.diags_array(self.weights)) @ op

    def weighted_matrix(self) -> sp.csr_array | np.ndarray:
        """``D M`` as an explicit matrix. Raises FormError for a matrix-free ``M``."""
        if self.is_matrix_free:
            raise FormError("M is a LinearOperator; an explicit matrix is not available")
        if self.weights is None:
            return self.M
        if sp.issparse(self.M):
            return sp.csr_array(sp.diags_array(self.weights) @ self.M)
        return self.weights[:, None] * self.M

    def weighted_target(self) -> np.ndarray:
        """``D y``."""
        return self.y if self.weights is None else self.weights * self.y

    def objective(self, v: np.ndarray) -> float:
        """``‖D (M v − y)‖²`` at ``v``."""
        r = self.M @ np.asarray(v, dtype=np.float64) - self.y
        if self.weights is not None:
            r = self.weights * r
        return float(r @ r)

    def to_program(self) -> ProgramForm:
        """The equivalent sparse QP, lifted so that ``MᵀM`` is never formed.

        Variables ``(v, r)`` with ``r = D(Mv − y)`` imposed by rows named ``"residual[i]"``;
        objective ``½ (v, r)ᵀ diag(0, 2I) (v, r) = ‖r‖²``. The first ``n`` entries of a
        solution are ``v``. Raises FormError for a matrix-free ``M``.
        """
        DM = sp.csr_array(self.weighted_matrix())
        k, n = DM.shape
        A = sp.hstack([DM, -sp.eye_array(k)], format="csr")
        P = sp.block_diag([sp.csc_array((n, n)), 2.0 * sp.eye_array(k)], format="csc")
        target = self.weighted_target()
        return ProgramForm(
            c=np.zeros(n + k), A=A, row_lower=target, row_upper=target,
            row_names=[f"residual[{i}]" for i in range(k)],
            lower=np.concatenate([self.lower, np.full(k, -np.inf)]),
            upper=np.concatenate([self.upper, np.full(k, np.inf)]),
            P=P,
        )
