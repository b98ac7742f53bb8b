"""Optimised strategies: HDMM's templates fitted by L-BFGS-B on the expected error, and an
exact search for small domains.

* :func:`optimize_pidentity` — OPT_0 of HDMM (McKenna, Miklau, Hay, Machanavajjhala, VLDB 2018,
  §5.1): the p-Identity template ``[I ; Θ] D`` (:class:`~dpopt.model.queries.PIdentity`) with
  ``Θ >= 0`` minimising ``trace(G (AᵀA)^{-1})``; the sensitivity is 1 by construction, so this
  is the expected error per unit of the noise constant. Objective and gradient use the Woodbury
  form of :class:`~dpopt.strategy.gram.PIdentityGram`: one product of ``G`` with ``p`` vectors
  and ``O(p² n)`` work per evaluation, never an ``n x n`` matrix.
* :func:`optimize_kronecker` — OPT_⊗ (HDMM §5.2): one p-Identity per attribute, combined as a
  Kronecker product, for workloads that are sums of Kronecker products (marginals, boxes,
  products of per-attribute queries): alternately refit one attribute's template on the
  workload seen through the others (the other factors' traces weight its terms).
* :func:`optimize_marginals` — OPT_M (HDMM §6.2): weights on every marginal, the strategy
  ``[θ_S M_S]_S``, in the marginals algebra (any domain size).
* :func:`exact_strategy` — the optimal strategy under Gaussian noise for a small domain: the
  convex program ``min trace(G M^{-1})`` s.t. ``diag(M) <= 1``, ``M ⪰ 0`` over ``M = AᵀA`` (Li
  et al., PODS 2010 §4 state the strategy search as a semidefinite program; with the L2
  sensitivity it is convex), solved by cvxpy and verified here.

The random starts are public (they depend on nothing private) and seeded for reproducible plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as la
from scipy.optimize import Bounds, minimize
from threadpoolctl import threadpool_limits

from dpopt.errors import QueryError, SolverError
from dpopt.model.domain import Domain
from dpopt.model.queries.base import LinearQuery
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.combine import Stack, Weighted
from dpopt.model.queries.explicit import SparseQuery
from dpopt.model.queries.hierarchical import tree_intervals
from dpopt.model.queries.kronecker import Kronecker
from dpopt.model.queries.marginal import Marginal
from dpopt.model.queries.pidentity import NORMS, PIdentity, column_scale
from dpopt.strategy.error import dense_pinv, interval_forms, kron_terms, trace_term
from dpopt.strategy.gram import (
    DenseGram,
    MarginalsGram,
    PIdentityGram,
    RangeGram,
    WorkloadGram,
    subset_sums,
    superset_sums,
)
from dpopt.strategy.workload import gram_of

__all__ = ["OptimizedStrategy", "optimize_pidentity", "optimize_kronecker", "optimize_marginals",
           "exact_strategy", "default_p"]


@dataclass
class OptimizedStrategy:
    """An optimised strategy and how it was found.

    Attributes
    ----------
    query : LinearQuery
        The strategy (sensitivity 1 in ``norm``).
    loss : float
        ``‖A‖² trace(G (AᵀA)⁺)`` in ``norm``: the expected total squared error per unit of the
        noise constant (e.g. times ``2 / ε²`` for Laplace).
    template : str
        ``"p-identity"``, ``"kronecker"``, ``"marginals"`` or ``"exact"``.
    norm : {"l1", "l2"}
    seconds, iterations : float, int
    info : dict
    """

    query: LinearQuery
    loss: float
    template: str
    norm: str
    seconds: float = 0.0
    iterations: int = 0
    info: dict = field(default_factory=dict)


def default_p(n: int) -> int:
    """``max(1, n // 16)`` extra rows (HDMM's default), capped at 64: an evaluation costs
    ``O(p² n)`` and L-BFGS-B's own work grows as ``p n``. Measured on 2,000 random ranges over
    4,357 values (Laplace): p = 16, 32, 64 reach 3.4, 2.8 and 2.4 (·10^5, error per unit
    noise); p = 272 did not finish in 15 minutes."""
    return int(min(64, max(1, n // 16)))


def _start_scale(loss: float) -> float:
    """The objective's unit: its value at the start, so that L-BFGS-B's relative tolerance
    means the same on every workload (it is absolute below 1)."""
    if not (np.isfinite(loss) and loss > 0):
        raise QueryError(f"strategy optimisation: the objective at the start is {loss!r}; the template cannot "
                         "support this workload")
    return float(loss)


def _check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise QueryError(f"strategy optimisation: norm must be one of {list(NORMS)}, got {norm!r}")
    return norm


# ---- p-Identity (OPT_0) ---------------------------------------------------------------------------
def pidentity_loss(theta: np.ndarray, gram: WorkloadGram, norm: str) -> tuple[float, np.ndarray]:
    """``trace(G (AᵀA)^{-1})`` of ``A = [I ; Θ] D`` and its gradient in ``Θ`` (module notes).

    With ``X = S G S``, ``B = (I + ΘᵀΘ)^{-1}``, ``K = (I + ΘΘᵀ)^{-1}`` (so ``ΘB = KΘ``)::

        f = trace(X B) = trace(X) - trace(K Θ X Θᵀ)
        ∂f/∂Θ |_s = -2 K (Θ X - (Θ X Θᵀ) K Θ)
        ∂f/∂s_j   = 2 (X B)_jj / s_j,  (X B)_jj = X_jj - sum_k (Θ X)_kj (K Θ)_kj

    and ``∂s_j/∂Θ_ij`` is 1 (``l1``) or ``Θ_ij / s_j`` (``l2``).
    """
    p = theta.shape[0]
    s = column_scale(theta, norm)
    inner = np.eye(p) + theta @ theta.T
    try:
        chol = la.cho_factor(inner, check_finite=False)
    except la.LinAlgError:
        return np.inf, np.zeros_like(theta)
    K = la.cho_solve(chol, np.eye(p), check_finite=False)
    st = theta * s[None, :]                           # Θ S
    theta_x = gram.apply_rows(st) * s[None, :]       # Θ X = Θ S G S
    txt = theta_x @ theta.T                           # Θ X Θᵀ
    diag_x = gram.diagonal() * s * s
    loss = float(diag_x.sum() - np.sum(K * txt))
    k_theta = K @ theta
    grad = -2.0 * (K @ theta_x - (K @ txt) @ k_theta)
    xb_diag = diag_x - np.sum(theta_x * k_theta, axis=0)
    ds = 2.0 * xb_diag / s
    grad += ds[None, :] if norm == "l1" else ds[None, :] * theta / s[None, :]
    return loss, grad


def optimize_pidentity(gram: WorkloadGram | LinearQuery, p: int | None = None, norm: str = "l1", *,
                       seed: int = 0, init: str | np.ndarray = "auto", max_iter: int = 150,
                       tol: float = 1e-6) -> OptimizedStrategy:
    """OPT_0: the p-Identity strategy minimising the expected error for a workload.

    Parameters
    ----------
    gram : WorkloadGram or LinearQuery
        The workload (or its Gram), over a domain small enough to hold densely.
    p : int, optional
        Extra rows (default :func:`default_p`).
    norm : {"l1", "l2"}
        Sensitivity the template normalises: ``"l1"`` for Laplace, ``"l2"`` for Gaussian noise.
    seed : int
        The public random start.
    init : {"auto", "random", "tree"} or ndarray
        ``"random"``: uniform on ``[0, 1)`` (HDMM). ``"tree"``: the first ``p`` nodes of the
        binary interval tree (root first) at weight 1/2 plus a 1% random perturbation; on range
        workloads it reaches a given error in about half the iterations (measured on 2,000
        random ranges over 4,357 values). ``"auto"``: ``"tree"`` over one attribute, else
        ``"random"``. An array is a warm start ``Θ``.
    max_iter, tol
        L-BFGS-B's iteration limit and relative objective tolerance (``ftol``). On 2,000 random
        ranges over 4,357 values (p = 64, tree start) the error after 100 evaluations was within
        1.5% of the error after 200.
    """
    start = time.perf_counter()
    gram = gram if isinstance(gram, WorkloadGram) else gram_of(gram)
    norm = _check_norm(norm)
    n = gram.domain.require_dense("a p-Identity strategy")
    theta0 = _pidentity_start(gram.domain, n, p, seed, init)
    shape = theta0.shape
    scale = _start_scale(pidentity_loss(theta0, gram, norm)[0])

    def fun(flat):
        loss, grad = pidentity_loss(flat.reshape(shape), gram, norm)
        return loss / scale, grad.ravel() / scale

    # One BLAS thread: the products are n x p with p <= 64, where threads cost more than they save
    # (4,357 values: 5.1 s on one thread, 10.7 s on two).
    with threadpool_limits(limits=1, user_api="blas"):
        res = minimize(fun, theta0.ravel(), jac=True, method="L-BFGS-B",
                       bounds=Bounds(np.zeros(theta0.size), np.full(theta0.size, np.inf)),
                       options={"maxiter": int(max_iter), "ftol": float(tol), "gtol": 1e-12, "maxcor": 10})
    theta = np.maximum(res.x.reshape(shape), 0.0)
    query = PIdentity(gram.domain, theta, norm=norm)
    loss = PIdentityGram(gram.domain, query.theta, query.scale).trace_with(gram)
    return OptimizedStrategy(query, float(loss), "p-identity", norm, time.perf_counter() - start, int(res.nit),
                             {"p": int(shape[0]), "message": str(res.message), "evaluations": int(res.nfev)})


def _pidentity_start(domain: Domain, n: int, p, seed: int, init) -> np.ndarray:
    if isinstance(init, np.ndarray):
        theta0 = np.asarray(init, dtype=np.float64)
        if theta0.ndim != 2 or theta0.shape[1] != n or (theta0 < 0).any() or not np.isfinite(theta0).all():
            raise QueryError(f"optimize_pidentity: init must be a finite non-negative (p, {n}) array, "
                             f"got shape {theta0.shape}")
        return theta0.copy()
    if init not in ("auto", "random", "tree"):
        raise QueryError(f"optimize_pidentity: init must be 'auto', 'random', 'tree' or an array, got {init!r}")
    p = default_p(n) if p is None else p
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise QueryError(f"optimize_pidentity: p must be an integer >= 1, got {p!r}")
    rng = np.random.default_rng(seed)
    if init == "random" or (init == "auto" and len(domain) > 1) or n < 2:
        return rng.random((int(p), n))
    lows, highs, _ = tree_intervals(n, 2)
    lows, highs = lows[:p], highs[:p]
    cells = np.arange(n)
    theta0 = 0.5 * ((cells[None, :] >= lows[:, None]) & (cells[None, :] <= highs[:, None]))
    theta0 = np.vstack([theta0, np.zeros((int(p) - theta0.shape[0], n))])
    return theta0 + 0.01 * rng.random(theta0.shape)


# ---- Kronecker products of p-Identity (OPT_⊗) --------------------------------------------------------
def optimize_kronecker(gram: WorkloadGram | LinearQuery, norm: str = "l1", *, p=None, seed: int = 0,
                       rounds: int = 8, tol: float = 1e-4, max_iter: int = 150) -> OptimizedStrategy:
    """OPT_⊗: a Kronecker product of per-attribute p-Identity strategies.

    The workload must be a sum of Kronecker products over single attributes: marginals,
    boxes (ranges over several attributes), Kronecker workloads and stacks of them. Each round
    refits every attribute's template on ``sum_t w_t (prod_{j≠i} c_tj) G_ti``, ``c_tj`` the
    current trace of term ``t``'s factor ``j``; it stops when a round improves the loss by less
    than ``tol`` (relative) or after ``rounds`` rounds.

    ``p`` is an int for every attribute, a dict by attribute, or None (:func:`default_p`).
    """
    start = time.perf_counter()
    gram = gram if isinstance(gram, WorkloadGram) else gram_of(gram)
    norm = _check_norm(norm)
    dom = gram.domain
    attrs = dom.attrs
    groups = tuple((a,) for a in attrs)
    sub = [dom.project([a]) for a in attrs]
    boxes = gram if isinstance(gram, RangeGram) else None
    terms = None if boxes is not None else kron_terms(gram, groups)
    if boxes is None and terms is None:
        raise QueryError("optimize_kronecker: the workload is not a sum of Kronecker products over single attributes "
                         "(marginals, boxes, Kronecker queries and stacks of them are)")
    sizes = [d.size for d in sub]
    ps = [_p_for(p, a, n) for a, n in zip(attrs, sizes)]
    rng = np.random.default_rng(seed)
    thetas = [rng.random((k, n)) for k, n in zip(ps, sizes)]
    strategies = [PIdentityGram(d, t, column_scale(t, norm)) for d, t in zip(sub, thetas)]

    def factor_traces(i):
        if boxes is not None:
            return interval_forms(strategies[i], boxes.lows[:, i], boxes.highs[:, i])
        return np.array([trace_term(t.factors[i], strategies[i]) for t in terms])

    weights = boxes.weights if boxes is not None else np.array([t.weight for t in terms])
    traces = [factor_traces(i) for i in range(len(attrs))]
    history = [float(weights @ np.prod(traces, axis=0))]
    nit = 0
    for _ in range(int(rounds)):
        for i in range(len(attrs)):
            others = np.prod([traces[j] for j in range(len(attrs)) if j != i], axis=0) if len(attrs) > 1 \
                else np.ones_like(weights)
            coef = weights * others
            if boxes is not None:
                local = RangeGram(sub[i], boxes.lows[:, i:i + 1], boxes.highs[:, i:i + 1], coef)
            else:
                local = DenseGram(sub[i], sum(c * t.factors[i].dense() for c, t in zip(coef, terms)))
            fit = optimize_pidentity(local, norm=norm, init=thetas[i], max_iter=max_iter)
            nit += fit.iterations
            before = (thetas[i], strategies[i], traces[i])
            current = float(weights @ np.prod(traces, axis=0))
            thetas[i] = np.asarray(fit.query.theta)
            strategies[i] = PIdentityGram(sub[i], thetas[i], fit.query.scale)
            traces[i] = factor_traces(i)
            if float(weights @ np.prod(traces, axis=0)) > current:  # keep the loss non-increasing
                thetas[i], strategies[i], traces[i] = before
        history.append(float(weights @ np.prod(traces, axis=0)))
        if history[-2] - history[-1] <= tol * history[-2]:
            break
    query = Kronecker([PIdentity(d, t, norm=norm) for d, t in zip(sub, thetas)], dom)
    return OptimizedStrategy(query, history[-1], "kronecker", norm, time.perf_counter() - start, nit,
                             {"p": dict(zip(attrs, ps)), "losses": history})


def _p_for(p, attr: str, n: int) -> int:
    if p is None:
        return default_p(n)
    value = p.get(attr, default_p(n)) if isinstance(p, dict) else p
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise QueryError(f"optimize_kronecker: p for attribute {attr!r} must be an integer >= 1, got {value!r}")
    return int(value)


# ---- weighted marginals (OPT_M) ----------------------------------------------------------------------
def marginals_loss(theta: np.ndarray, workload: MarginalsGram, norm: str) -> tuple[float, np.ndarray]:
    """``‖A‖² trace(G (AᵀA)⁺)`` of ``A = [θ_S M_S]_S`` and its gradient in ``θ`` (shape ``(2,)*d``).

    ``AᵀA = sum_S θ_S² G_S`` has the eigenvalue ``μ(a) = sum_{S ⊇ a} θ_S² N_{S^c}`` on ``U_a``
    (:mod:`dpopt.strategy.gram`), so ``T = sum_a dim_a μ_W(a) / μ(a)`` and
    ``∂T/∂θ_S = -2 θ_S N_{S^c} sum_{a ⊆ S} dim_a μ_W(a) / μ(a)²``. Every record lies in one cell
    of each marginal: ``‖A‖₁ = sum θ_S``, ``‖A‖²_{1→2} = sum θ_S²``.
    """
    out = workload.outside_sizes()
    demand = workload.dimensions() * workload.eigenvalues()
    mu = superset_sums(theta * theta * out)
    live = demand > 0
    if (mu[live] <= 0).any():
        return np.inf, np.zeros_like(theta)
    ratio = np.where(live, demand / np.where(live, mu, 1.0), 0.0)
    T = float(ratio.sum())
    dT = -2.0 * theta * out * subset_sums(np.where(live, ratio / np.where(live, mu, 1.0), 0.0))
    if norm == "l1":
        sens, dsens = float(theta.sum()) ** 2, 2.0 * float(theta.sum()) * np.ones_like(theta)
    else:
        sens, dsens = float((theta * theta).sum()), 2.0 * theta
    return sens * T, dsens * T + sens * dT


def optimize_marginals(workload: MarginalsGram | LinearQuery, norm: str = "l1", *, seed: int = 0,
                       max_iter: int = 5000, tol: float = 1e-10, candidates: str = "all") -> OptimizedStrategy:
    """OPT_M: a weighted union of marginals minimising the expected error of a marginal workload.

    ``candidates = "all"`` (default, as HDMM) optimises a weight for every subset of the
    attributes (``2^d`` of them); ``"closure"`` only for the workload's sets and their subsets
    (fewer parameters; it leaves out e.g. the identity, which under Laplace noise can be best).
    """
    start = time.perf_counter()
    G = workload if isinstance(workload, WorkloadGram) else gram_of(workload)
    if not isinstance(G, MarginalsGram):
        raise QueryError("optimize_marginals: the workload is not a union of (weighted) marginals")
    norm = _check_norm(norm)
    d = len(G.domain)
    if candidates == "closure":
        allowed = superset_sums((G.weights > 0).astype(float)) > 0  # a ⊆ some workload set
    elif candidates == "all":
        allowed = np.ones((2,) * d, dtype=bool)
    else:
        raise QueryError(f"optimize_marginals: candidates must be 'closure' or 'all', got {candidates!r}")
    bounds = Bounds(np.zeros(allowed.size), np.where(allowed.ravel(), np.inf, 0.0))
    rng = np.random.default_rng(seed)
    # The L1 objective is not convex: start from the workload's own sets, from the identity
    # and from a random point, and keep the best (so the result is never worse than measuring
    # the workload or the identity).
    workload_start = (G.weights > 0).astype(float)
    identity_start = np.zeros((2,) * d)
    identity_start[(1,) * d] = 1.0
    best = None
    for theta0 in (workload_start, identity_start, 0.5 + rng.random((2,) * d)):
        theta0 = np.where(allowed, theta0, 0.0)
        if not np.isfinite(marginals_loss(theta0, G, norm)[0]):
            continue  # e.g. the identity start when the full set is not a candidate
        scale = _start_scale(marginals_loss(theta0, G, norm)[0])

        def fun(flat, scale=scale):
            loss, grad = marginals_loss(flat.reshape((2,) * d), G, norm)
            return loss / scale, grad.ravel() / scale

        res = minimize(fun, theta0.ravel(), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": int(max_iter), "ftol": float(tol), "gtol": 1e-14, "maxcor": 30})
        value = float(res.fun) * scale
        if best is None or value < best[0]:
            best = (value, res)
    res = best[1]
    theta = np.maximum(res.x.reshape((2,) * d), 0.0)
    theta = theta / (theta.sum() if norm == "l1" else np.sqrt((theta * theta).sum()))  # sensitivity 1
    loss, _ = marginals_loss(theta, G, norm)
    return OptimizedStrategy(marginal_strategy(G.domain, theta), float(loss), "marginals", norm,
                             time.perf_counter() - start, int(res.nit),
                             {"weights": {", ".join(s) or "(total)": w for s, w in _weights_of(G.domain, theta)},
                              "message": str(res.message)})


def _weights_of(domain: Domain, theta: np.ndarray, floor: float = 1e-12) -> list[tuple[tuple[str, ...], float]]:
    out = []
    top = float(theta.max())
    for index in zip(*np.nonzero(theta > floor * top)):
        out.append((tuple(a for a, bit in zip(domain.attrs, index) if bit), float(theta[index])))
    return out


def marginal_strategy(domain: Domain, theta: np.ndarray, floor: float = 1e-12) -> LinearQuery:
    """``[θ_S M_S]_S`` as a stack of weighted marginals (the identity for ``S`` = all, the total
    for the empty set); weights below ``floor`` times the largest are dropped."""
    parts: list[LinearQuery] = []
    for attrs, w in _weights_of(domain, theta, floor):
        if not attrs:
            q = Total(domain)
        elif attrs == domain.attrs:
            q = Identity(domain)
        else:
            q = Marginal(domain, attrs)
        parts.append(q if w == 1.0 else Weighted(q, w))
    return parts[0] if len(parts) == 1 else Stack(parts)


# ---- the exact search (small domains, Gaussian) -----------------------------------------------------
def exact_strategy(gram: WorkloadGram | LinearQuery, *, solver: str | None = None, max_cells: int = 64,
                   verify_tol: float = 1e-5) -> OptimizedStrategy:
    """The strategy with the least expected error under Gaussian noise (L2 sensitivity 1).

    Solves ``min trace(G M^{-1})`` s.t. ``diag(M) <= 1``, ``M ⪰ 0`` with cvxpy
    (``matrix_frac(G^{1/2}, M)``), then returns ``A = Lᵀ`` for ``M = L Lᵀ``. The optimum is
    recomputed from ``A`` and compared with the solver's value (relative ``verify_tol``);
    a mismatch or a non-optimal status raises :class:`SolverError`.
    """
    import cvxpy as cp

    start = time.perf_counter()
    G = gram if isinstance(gram, WorkloadGram) else gram_of(gram)
    n = G.size
    if n > max_cells:
        raise QueryError(f"exact_strategy: {n} cells is above max_cells = {max_cells} (the program has n² variables)")
    Gd = G.dense()
    eigval, eigvec = la.eigh(Gd)
    root = (eigvec * np.sqrt(np.clip(eigval, 0, None))) @ eigvec.T
    unit = max(float(np.trace(Gd)), 1e-300)
    M = cp.Variable((n, n), PSD=True)
    problem = cp.Problem(cp.Minimize(cp.matrix_frac(root / np.sqrt(unit), M)), [cp.diag(M) <= 1])
    if solver is None and "CLARABEL" in cp.installed_solvers():
        solver = "CLARABEL"  # interior point: accurate to the tolerance it certifies
    try:
        problem.solve(solver=solver)
    except cp.error.SolverError as exc:
        raise SolverError(f"exact_strategy: cvxpy could not solve the strategy program: {exc}") from None
    if problem.status != cp.OPTIMAL or M.value is None:
        raise SolverError(f"exact_strategy: the strategy program ended with status {problem.status!r}")
    Mv = (M.value + M.value.T) / 2
    w, V = la.eigh(Mv)
    w = np.clip(w, 0.0, None)
    A = (V * np.sqrt(w)).T                    # AᵀA = M (rows scaled eigenvectors)
    A = A[np.sqrt(w) > 1e-9 * np.sqrt(w.max())]
    A = A / np.sqrt(max(1.0, float(np.max((A * A).sum(axis=0)))))  # L2 sensitivity <= 1 exactly
    query = SparseQuery(G.domain, A)
    pinv, null = dense_pinv(A.T @ A)
    loss = float(np.sum(Gd * pinv)) * float(np.max((A * A).sum(axis=0)))
    claimed = float(problem.value) * unit
    if null.shape[1] and float(np.sum(null * (Gd @ null))) > 1e-8 * unit:
        raise SolverError("exact_strategy: the solver's strategy does not support the workload")
    if abs(loss - claimed) > verify_tol * max(abs(claimed), 1e-300):
        raise SolverError(f"exact_strategy: the recomputed error {loss:.8g} differs from the solver's optimum "
                          f"{claimed:.8g} by more than {verify_tol:g} (relative)")
    return OptimizedStrategy(query, loss, "exact", "l2", time.perf_counter() - start, 0,
                             {"solver": problem.solver_stats.solver_name, "solver_value": claimed})
