"""From noisy marginals to the consistent, non-negative marginals that fit them best.

:func:`estimate_marginals` is the one call: measurements of marginals (any attribute sets,
any noise law: only each measurement's variance enters) and optionally a workload of further
attribute sets go in; the workload's marginals come out, consistent with each other and
non-negative, as the weighted least-squares fit of the measurements over the local marginal
polytope (problem (4) of :mod:`~dpopt.estimate.marginal_space.polytope.projection`), certified by its
duality gap. The full table is never formed: memory is a few vectors over the cells of the
*cliques* (the largest sets among the workload, the measured sets and the constraints' sets)
and over their residuals.

Steps (module notes of each):

1. :mod:`~dpopt.estimate.marginal_space.layout` — the cliques and the downward closure of
   their residuals (an attribute no set holds is released uniform, outside the projection);
2. :mod:`~dpopt.estimate.marginal_space.gls` — the unconstrained least squares, one
   inverse-variance average per residual; exact measurements and invariants fix residuals;
3. residuals that no measurement covers (workload sets above what was measured) get a weak
   quadratic prior of weight ``D_A / (PRIOR_RATIO * L)``, where ``L = max D_A / W_A`` over
   measured residuals: negligible against any measurement, yet it keeps the dual's condition
   number within a factor ``PRIOR_RATIO`` of the measured problem's. Its centre is the
   *independence prior* of :mod:`~dpopt.estimate.marginal_space.prior`: the residual the set
   would have if its attributes were independent across the groups no measurement links
   (two attributes whose pair was never measured: ``mu_ab = mu_a ⊗ mu_b / N``), zero for an
   interaction whose every pair was measured. It does not carry dependence through a common
   neighbour as a graphical model's maximum-entropy completion does: measure what is released;
4. :mod:`~dpopt.estimate.marginal_space.polytope.projection` — non-negativity and structural zeros by
   the dual of (4) (L-BFGS-B and the polish; on large problems projected Newton first, stopped
   when it stalls, then ADMM), and the duality-gap certificate (its feasible point from the
   interior point of :mod:`~dpopt.estimate.marginal_space.polytope.interior`, or, after ADMM, from
   the local repair and records of :mod:`~dpopt.estimate.marginal_space.polytope.local_repair`).
   The estimate's message names the methods that ran.

This module is post-processing only: it never sees data or randomness.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from dpopt.errors import DomainError, ParameterError, QueryError
from dpopt.estimate.certificates.verify import CERTIFICATE_TOL, feasibility_tolerance
from dpopt.estimate.marginal_space.gls import fit_residuals
from dpopt.estimate.marginal_space.polytope.interior import interior_residuals
from dpopt.estimate.marginal_space.layout import (
    ResidualIndex,
    SetFamily,
    check_sets,
    is_decomposable,
    maximal_sets,
    measured_and_workload_axes,
)
from dpopt.estimate.marginal_space.prior import independence_prior, shrink_to_independence
from dpopt.estimate.marginal_space.polytope.projection import ProjectionProblem, project
from dpopt.estimate.marginal_space.result import MarginalEstimate
from dpopt.estimate.marginal_space.total import LAPLACE_NOISE, check_total, choose_total
from dpopt.estimate.status import Status
from dpopt.model.constraints import ConstraintSet
from dpopt.model.domain import Domain
from dpopt.model.measurement import Measurement
from dpopt.model.queries.basic import Identity, Total
from dpopt.model.queries.marginal import Marginal

__all__ = ["estimate_marginals", "marginal_sets", "choose_objective", "smooth_cannot_keep", "ObjectiveChoice", "OBJECTIVES",
           "SMOOTH_TREE_CELLS", "PRIOR_RATIO", "MAX_CLIQUE_CELLS", "EXACT_CELLS"]

#: Condition-number allowance of the prior on unmeasured residuals (step 3 of the module notes).
PRIOR_RATIO = 1e3
#: Largest number of clique cells held (the solver keeps about ten vectors of that length).
MAX_CLIQUE_CELLS = 2**27
#: Domains up to this many cells are solved as a table (exact); larger ones in marginal space.
EXACT_CELLS = 2**20
#: Largest junction tree (cells over its cliques) on which ``objective="auto"`` takes the smooth
#: estimate. A judgement from the validation runs of issue 27 (bench_wide_smooth.py, networks 3/4/5:
#: every tree auto's selection gave held at most 1,400 cells; the adult chain's 1.54 M cells took
#: 12–33 CPU-s and 0.6 GB), not a derived constant: it keeps the smooth estimate to trees that
#: solve in a minute or so and about a gigabyte (:data:`dpopt.algorithms.marginal_space.TREE_BYTES_PER_CELL`).
SMOOTH_TREE_CELLS = 2**22
#: ``objective`` of :func:`estimate_marginals`: the rule, least squares, or the smooth estimate.
OBJECTIVES = ("auto", "l2", "smooth")


@dataclass(frozen=True)
class ObjectiveChoice:
    """What :func:`choose_objective` decided: ``objective`` (``"l2"`` or ``"smooth"``), asked for
    as ``asked``, with its ``reason``; ``tree_cells`` the smooth estimate's junction tree (None
    when not computed, or when above ``limit``); ``table``: the domain is solved as a table."""

    asked: str
    objective: str
    reason: str
    tree_cells: int | None
    limit: int
    table: bool

    def info(self) -> dict:
        return {"asked": self.asked, "objective": self.objective, "reason": self.reason,
                "tree_cells": self.tree_cells, "limit": self.limit, "table": self.table}


def smooth_cannot_keep(constraints: ConstraintSet | None, total: float | str = "auto",
                       exact: str | None = None) -> str | None:
    """What a release declares that the smooth estimate does not keep (a public count, structural
    zeros, a hierarchy, an inequality), as the reason of a one-line message, or None."""
    if exact is not None:
        return f"measurement {exact!r} is exact (a public count), which the smooth estimate does not keep"
    if not isinstance(total, str):
        return "a public total is given, which the smooth estimate does not keep"
    if constraints is not None and isinstance(constraints, ConstraintSet):
        kept = [what for what, present in (("invariants", constraints.invariants),
                                           ("inequalities", constraints.inequalities),
                                           ("structural zeros or hierarchies", list(constraints.zero_patterns())))
                if present]
        if kept:
            return f"the constraints declare {kept[0]}, which the smooth estimate does not keep"
    return None


def choose_objective(domain: Domain, measured: Sequence[Sequence[str]],
                     workload: Iterable[Sequence[str]] | None = None, constraints: ConstraintSet | None = None, *,
                     exact: str | None = None, total: float | str = "auto", shrink: bool = False,
                     nonnegative: bool = True, exact_cells: int = EXACT_CELLS,
                     limit: int = SMOOTH_TREE_CELLS) -> ObjectiveChoice:
    """The rule of ``objective="auto"``: the smooth estimate where it applies and its junction tree
    is small, least squares otherwise. Public quantities only (the measured sets, whether a
    measurement is exact, the domain's sizes, the declared constraints and options); never the
    answers, so a plan can state the choice before any measurement.

    Parameters
    ----------
    domain : Domain
    measured : sequence of attribute-name sets
        The measured marginals' sets (``()`` for a total; every attribute for the identity).
    workload : iterable of attribute-name sets, optional
        The marginals to release (they do not enlarge the tree, see
        :func:`~dpopt.estimate.marginal_space.graphical.smooth.tree_sets`).
    constraints : ConstraintSet, optional
    exact : str, optional
        The label of an exact measurement (variance 0), if any.
    total, shrink, nonnegative, exact_cells
        As for :func:`estimate_marginals`.
    limit : int
        The junction tree's largest size (default :data:`SMOOTH_TREE_CELLS`).

    Least squares (``"l2"``) when any of these holds, in this order (the reason names the first):

    1. a public count is declared — an invariant, an exact measurement (variance 0), a number
       for ``total`` — or structural zeros, a hierarchy or an inequality: the smooth estimate
       keeps non-negativity only (:mod:`~dpopt.estimate.marginal_space.graphical.smooth`, *Scope*);
    2. ``shrink=True`` or ``nonnegative=False``: options of the least-squares fit;
    3. the domain is larger than ``exact_cells`` and the junction tree of the measured sets
       (:func:`~dpopt.estimate.marginal_space.graphical.smooth.tree_cells`) holds more than ``limit``
       (:data:`SMOOTH_TREE_CELLS`) cells, or one Newton product would read more cells than that
       (the tree's, plus each measured set's clique: many sets on one large clique are slow,
       e.g. all 231 pairs of 22 binary attributes on one clique of 2^22 cells: a test on it had
       not finished after about 9 CPU-minutes).

    4. the domain has at most ``exact_cells`` cells (it is solved as a table): there the smooth
       estimate is not better everywhere — below least squares on nltcs at all four budgets, but
       worse than the noisy answers themselves on a census table (issue 25) — and the dense
       algorithm ``auto`` chooses a table's fit by its estimated risk.

    Otherwise the smooth estimate on the junction tree. Evidence (issue 27, same measurements):
    it was below least squares in 42 of 43 validation rows where the tree fitted (the one loss
    1.4 %), on the adult chain at zCDP ε 0.1 and 1, and on the networks of bench_wide.py.

    Returns
    -------
    ObjectiveChoice
    """
    table = bool(exact_cells) and domain.size <= exact_cells

    def least_squares(reason, cells=None):
        return ObjectiveChoice("auto", "l2", f"least squares: {reason}", cells, limit, table)

    unkept = smooth_cannot_keep(constraints, total, exact)
    if unkept is not None:
        return least_squares(unkept)
    if shrink:
        return least_squares("shrink = true is a least-squares option")
    if nonnegative is not True:
        return least_squares("nonnegative = false is a least-squares option")
    if table:
        # On a table the evidence is mixed (better on nltcs, worse than the noisy answers on a
        # census table: issue 25), and the dense algorithm `auto` chooses a table's fit by its
        # estimated risk; here least squares stays the default.
        return least_squares(f"the domain's {domain.size:,} cells fit a table (at most exact_cells = "
                             f"{exact_cells:,}), where the smooth estimate is not better everywhere (ask for "
                             "objective = 'smooth', or use the algorithm auto, which chooses by estimated risk)")
    from dpopt.estimate.marginal_space.graphical.smooth import read_cells, tree_cells

    axes = [tuple(sorted(domain.axes(s))) for s in measured if s]
    work = [] if workload is None else check_sets(domain, list(workload), "workload")
    cells, largest, reads = tree_cells(domain.sizes, axes, work, limit)
    if cells > limit:
        return least_squares(f"the junction tree of the measured sets holds more than {limit:,} cells "
                             f"(SMOOTH_TREE_CELLS; a clique of {math.prod(domain.sizes[a] for a in largest):,} "
                             f"cells: {', '.join(domain.attrs[a] for a in largest)})")
    if reads > limit:
        return least_squares(f"the junction tree of the measured sets holds {cells:,} cells, but each Newton "
                             f"product would read {reads:,} (many measured sets share its cliques), above "
                             f"{limit:,} (SMOOTH_TREE_CELLS)", cells)
    read, worst = read_cells(domain.sizes, axes, work, MAX_CLIQUE_CELLS)
    if read > MAX_CLIQUE_CELLS:
        return least_squares(f"reading the workload marginal on ({', '.join(domain.attrs[a] for a in worst)}) off "
                             f"the junction tree needs an array of {read:,} cells, above {MAX_CLIQUE_CELLS:,} "
                             "(MAX_CLIQUE_CELLS)", cells)
    return ObjectiveChoice("auto", "smooth", f"smooth: the junction tree of the measured sets holds {cells:,} "
                           f"cells and each Newton product reads {reads:,}, at most {limit:,} (SMOOTH_TREE_CELLS)",
                           cells, limit, False)


def marginal_sets(measurements: Sequence[Measurement], who: str = "measurement") -> list[tuple[str, ...]]:
    """The attribute set of each measurement's query: a :class:`Marginal`, :class:`Total` (the empty
    set) or :class:`Identity` (every attribute); QueryError naming any other."""
    out = []
    for i, m in enumerate(measurements):
        if not isinstance(m, Measurement):
            raise QueryError(f"{who} {i + 1}: expected a Measurement, got {type(m).__name__}")
        q = m.query
        if isinstance(q, Marginal):
            out.append(tuple(q.attrs))
        elif isinstance(q, Total):
            out.append(())
        elif isinstance(q, Identity):
            out.append(tuple(q.domain.attrs))
        else:
            raise QueryError(f"{who} {m.label!r} measures {q.name}: marginal-space estimation takes marginals, "
                             "totals and the identity (a marginal on every attribute), not other queries")
    return out


def sets_and_domain(measurements: Sequence[Measurement], caller: str) -> tuple[list[tuple[str, ...]], Domain]:
    """:func:`marginal_sets` of a non-empty list of measurements and the one domain they share;
    QueryError (naming ``caller``) when the list is empty or a measurement is over another domain."""
    if not measurements:
        raise QueryError(f"{caller}: give at least one measurement")
    sets = marginal_sets(measurements)
    domain = measurements[0].query.domain
    for m in measurements[1:]:
        if m.query.domain != domain:
            raise QueryError(f"measurement {m.label!r} is over {m.query.domain}, not {domain}")
    return sets, domain


def estimate_marginals(
    measurements: Sequence[Measurement],
    workload: Iterable[Sequence[str]] | None = None,
    constraints: ConstraintSet | None = None,
    *,
    total: float | str = "auto",
    nonnegative: bool = True,
    shrink: bool = False,
    tol: float = CERTIFICATE_TOL,
    time_limit: float | None = None,
    max_iter: int = 20000,
    max_cells: int = MAX_CLIQUE_CELLS,
    exact_cells: int = EXACT_CELLS,
    objective: str = "auto",
    smooth: dict | None = None,
) -> MarginalEstimate:
    """The consistent, non-negative workload marginals that fit the measured marginals best.

    Parameters
    ----------
    measurements : sequence of Measurement
        Noisy (or exact: variance 0) answers to :class:`~dpopt.model.queries.Marginal`,
        :class:`~dpopt.model.queries.Total` or :class:`~dpopt.model.queries.Identity` queries
        over one domain, with any noise law (Laplace or Gaussian, any accounting): each enters
        with weight ``1/variance``.
    workload : iterable of attribute lists, optional
        The marginals to release; default: every measured attribute set. Sets above what
        was measured are answered too (their unmeasured interactions get the weak independence
        prior of the module notes, step 3). On a domain solved as a table (``exact_cells``)
        they are what the dense least squares gives instead.
    constraints : ConstraintSet, optional
        Public constraints over the same domain: non-negativity (implied by ``nonnegative``),
        structural zeros and hierarchies (their attribute sets join the cliques and their cells
        are held at zero), invariants on marginals and totals (exact residuals), integrality
        (ignored here: see :func:`~dpopt.estimate.marginal_space.sampling.synthetic_records`).
        Inequalities and invariants on other queries are refused.
    total : float or {"auto", "measured", "free"}
        A number is a public record count (fixes the total, as an invariant on the total would).
        Otherwise, what to do with the total when nothing public fixes it
        (:mod:`~dpopt.estimate.marginal_space.total`): ``"measured"`` holds it at ``n̂``, the
        inverse-variance average of the measured marginals' totals (the unconstrained fit's total,
        unbiased, variance ``1/W_∅``); ``"free"`` leaves it to the non-negative fit, which the
        positive part of the noise inflates on sparse marginals; ``"auto"`` (default) holds it when
        the free total's predicted bias, from the noise scales, the marginals' cells and ``n̂``
        only, exceeds ``n̂``'s standard error. ``info["total"]`` says which and why.
    nonnegative : bool
        Impose non-negativity (default). False gives the consistent least-squares marginals
        (structural zeros still held).
    shrink : bool
        Empirical-Bayes shrinkage of the measured interactions towards independence
        (:func:`~dpopt.estimate.marginal_space.prior.shrink_to_independence`, equation (6)): the
        posterior mode under a normal prior whose variance per order is estimated from the
        measurements themselves. Off by default (the estimate is then the least-squares fit);
        worth it when many marginals share a small budget, so that each is noisier than the
        interactions it measures. Marginal space only (not on a domain solved as a table).
    tol : float
        Relative duality gap of the certificate (default dpopt's
        :data:`~dpopt.estimate.certificates.verify.CERTIFICATE_TOL`; the solver aims at a tenth of
        it); cells must be within :func:`~dpopt.estimate.certificates.verify.feasibility_tolerance`
        of their bounds.
    time_limit : float, optional
        Seconds for the solve; a solve that reaches it is status TIME_LIMIT, not an estimate.
    max_iter : int
        Iterations: products with the clique operator (L-BFGS-B steps, conjugate-gradient steps,
        ADMM steps) of every method the projection runs, together.
    max_cells : int
        Refuse (DomainError, before any work) cliques holding more cells than this.
    exact_cells : int
        Domains of at most this many cells are solved exactly as a table by
        :func:`dpopt.estimate.reconstruct` (weighted least squares, certified by its engine) and the
        marginals read off it (``info["polytope"] == "table"``). Larger domains are estimated in
        marginal space: exactly when the marginals are decomposable (the cliques of a chordal
        graph: their local polytope is the marginal polytope, ``"marginal"``), otherwise over the
        local relaxation (``"local"``), which can fit the noise more closely than any table could.

    objective : {"auto", "l2", "smooth"}
        ``"l2"``: the least-squares fit above. ``"smooth"``: the dense smooth estimate
        (least squares + ``λ D(x ‖ prior)`` in proximal steps, :mod:`dpopt.estimate.engines.smooth`)
        computed exactly by message passing on a junction tree of the measured sets
        (:mod:`~dpopt.estimate.marginal_space.graphical.smooth`; a domain of at most ``exact_cells`` cells is
        solved as a table by that engine); ``shrink`` and ``nonnegative=False`` do not apply to it,
        ``max_cells`` bounds the junction tree (DomainError naming its largest clique), and public
        counts, structural zeros and inequalities are refused. ``"auto"`` (default): the rule of
        :func:`choose_objective` — smooth when nothing it cannot keep is declared and its junction
        tree holds at most :data:`SMOOTH_TREE_CELLS` cells, least squares otherwise.
        ``info["objective"]`` says which was used and why (and the message ends with it).
    smooth : dict, optional
        Options of the smooth estimate (``prior``, ``steps``, ``smoothing``, ``tol``, ``max_newton``);
        under ``"auto"`` they apply when the rule chooses it.

    Returns
    -------
    MarginalEstimate
        ``status`` OPTIMAL only when the certificate holds (``info["certificate"]``).
    """
    if isinstance(objective, bool) or objective not in OBJECTIVES:
        raise ParameterError(f"objective must be one of {', '.join(map(repr, OBJECTIVES))}, got {objective!r}")
    if smooth is not None and objective == "l2":
        raise ParameterError("smooth options apply to objective 'smooth' or 'auto', not 'l2'")
    measurements = list(measurements)
    if not measurements:
        raise QueryError("estimate_marginals: give at least one measurement")
    workload = None if workload is None else list(workload)
    if objective == "auto":
        exact = next((m.label for m in measurements if not float(m.variance) > 0), None)
        choice = choose_objective(measurements[0].query.domain, marginal_sets(measurements), workload, constraints,
                                  exact=exact, total=total, shrink=shrink, nonnegative=nonnegative,
                                  exact_cells=exact_cells)
    else:
        choice = ObjectiveChoice(objective, objective, f"{'least squares' if objective == 'l2' else 'smooth'}: "
                                 "asked for", None, SMOOTH_TREE_CELLS, bool(exact_cells) and
                                 measurements[0].query.domain.size <= exact_cells)
    if choice.objective == "smooth":
        if shrink or nonnegative is not True:
            raise ParameterError("shrink and nonnegative=False apply to objective 'l2', not 'smooth'")
        from dpopt.estimate.marginal_space.graphical.smooth import estimate_smooth

        result = estimate_smooth(measurements, workload, constraints, total=total, time_limit=time_limit,
                                 max_cells=max_cells, exact_cells=exact_cells, **(smooth or {}))
        if choice.tree_cells is None and result.info.get("polytope") == "junction tree":
            choice = ObjectiveChoice(choice.asked, "smooth", choice.reason, int(result.info["clique_cells"]),
                                     choice.limit, False)
    else:
        result = _estimate_l2(measurements, workload, constraints, total=total, nonnegative=nonnegative,
                              shrink=shrink, tol=tol, time_limit=time_limit, max_iter=max_iter,
                              max_cells=max_cells, exact_cells=exact_cells)
    result.info["objective"] = choice.info()
    result.message = f"{result.message}; objective {choice.reason}"
    return result


def _estimate_l2(measurements: list[Measurement], workload, constraints, *, total, nonnegative, shrink, tol,
                 time_limit, max_iter, max_cells, exact_cells) -> MarginalEstimate:
    """The least-squares estimate (``objective="l2"``; the steps of the module notes)."""
    start = time.perf_counter()
    sets, domain = sets_and_domain(measurements, "estimate_marginals")
    zeros, exact = [], []
    if constraints is not None:
        zeros, exact = _constraint_parts(constraints, domain)
    total = check_total(total)
    if not isinstance(total, str):  # a public count: fixes the total, as an invariant on it would
        exact.append(((), np.array([total]), "public total"))
    if not isinstance(nonnegative, bool):
        raise ParameterError(f"nonnegative must be True or False, got {nonnegative!r}")
    if not isinstance(shrink, bool):
        raise ParameterError(f"shrink must be True or False, got {shrink!r}")
    if not (isinstance(tol, float) and 0 < tol < 1):
        raise ParameterError(f"tol must be a float in (0, 1), got {tol!r}")
    if time_limit is not None and not (float(time_limit) > 0):
        raise ParameterError(f"time_limit must be positive seconds, got {time_limit!r}")

    all_axes, work = measured_and_workload_axes(domain, sets, workload, "estimate_marginals")  # () for a total
    measured_axes = [a for a in all_axes if a]
    extra = [a for a, _ in zeros] + [a for a, _, _ in exact if a]
    # Every attribute is held (alone if nothing else holds it: uniform, as nothing is known of it),
    # so that records and marginals can be read over the whole domain.
    held = {a for s in work + measured_axes + extra for a in s}
    loose = [(a,) for a in range(len(domain)) if a not in held]
    cliques = maximal_sets(work + measured_axes + extra + loose)
    sizes = np.asarray(domain.sizes, dtype=np.int64)
    if exact_cells and domain.size <= exact_cells:
        polytope = "table"  # the full table fits: solved densely, exactly
    else:
        polytope = "marginal" if is_decomposable(cliques) else "local"
    clique_cells = sum(math.prod(int(sizes[a]) for a in c) for c in cliques)
    if clique_cells > max_cells:
        biggest = max(cliques, key=lambda c: math.prod(int(sizes[a]) for a in c))
        raise DomainError(
            f"the marginals to hold have {clique_cells:,} cells, above max_cells = {max_cells:,} (largest: "
            f"{', '.join(domain.attrs[a] for a in biggest)} with {math.prod(int(sizes[a]) for a in biggest):,} "
            "cells); release fewer or smaller marginals")

    tick = time.perf_counter()
    index = ResidualIndex(domain, cliques)
    family = SetFamily(index, cliques)
    labels = [m.label for m in measurements] + [name for _, _, name in exact]
    fit_sets = all_axes + [a for a, _, _ in exact]
    values = [m.values for m in measurements] + [v for _, v, _ in exact]
    variances = np.concatenate([[float(m.variance) for m in measurements], np.zeros(len(exact))])
    fit = fit_residuals(index, fit_sets, values, variances, labels)
    empty = index.position_of(())
    noisy_ms = [m for m in measurements if m.variance > 0]
    total_choice = choose_total(
        "free" if not isinstance(total, str) else total, float(fit.target[index.set_offsets[empty]]),
        float(fit.weight[empty]), np.array([m.query.num_rows for m in noisy_ms], dtype=np.float64),
        np.array([m.variance for m in noisy_ms]), np.array([m.noise in LAPLACE_NOISE for m in noisy_ms], dtype=bool),
        public=bool(fit.fixed[empty]), nonnegative=nonnegative)
    if total_choice.held and not fit.fixed[empty]:  # hold n̂: the empty set's residual fixed at its estimate
        fit.fixed = fit.fixed.copy()
        fit.fixed[empty] = True
        fit.target = fit.target.copy()
        fit.target[index.set_offsets[empty]] = total_choice.value  # n̂, or 0 when n̂ < 0 (total.py)
    time_fit = time.perf_counter() - tick

    # An attribute nothing holds is released uniform (its residual stays at the prior's centre, 0):
    # its singleton clique is left out of the projection, where its cells (N / n_a each) would only
    # add to the total's curvature D_∅ (by 1/n_a against 1/n_T of each held clique T) and so
    # inflate the dual's largest eigenvalue, the step scale of every solver iteration.
    solving = SetFamily(index, [c for c in cliques if c not in loose]) if loose else family
    diagonal = solving.diagonal()
    weight = fit.weight.copy()
    noisy = (weight > 0) & ~fit.fixed
    unmeasured = ~fit.measured
    if noisy.any():
        scale = float(np.max(diagonal[noisy] / weight[noisy]))
    else:
        scale = 1.0
    # (a loose attribute's own residual: any positive weight keeps it at its centre)
    weight[unmeasured] = np.where(diagonal > 0, diagonal, family.diagonal())[unmeasured] / (PRIOR_RATIO * scale)
    target = independence_prior(index, fit.target, fit.measured) if unmeasured.any() else fit.target
    shrinkage = None
    if shrink:
        target, weight, shrinkage = shrink_to_independence(index, target, weight, fit.measured, fit.fixed,
                                                           max_ratio=PRIOR_RATIO)
    fixed_total = bool(fit.fixed[index.position_of(())])
    total_value = float(fit.target[index.set_offsets[index.position_of(())]])
    feasibility = feasibility_tolerance(max(abs(total_value), 1.0))
    remaining = None if time_limit is None else max(float(time_limit) - (time.perf_counter() - start), 1e-3)
    interior = None
    table = None
    problem = None
    if polytope == "table":
        held = None if total_choice.mode == "public" or not total_choice.held else total_choice.value
        r, mu, status, message, certificate, nit, stopped, table = _solve_table(
            measurements, constraints, None if isinstance(total, str) else total, nonnegative, remaining, family,
            held_total=held)
        time_project = time.perf_counter() - start - time_fit
        history: list = []
    else:
        zero_cells = _zero_cells(solving, zeros, sizes) if zeros else None
        if nonnegative or zero_cells is not None:
            r_int = interior_residuals(index, [(a, v) for a, v, _ in exact if a], zeros,
                                       total_value if fixed_total else None)
            if r_int is not None:
                interior = (r_int, solving.expand(r_int))
        problem = ProjectionProblem(index, solving, target, weight, fit.fixed, zero_cells, interior,
                                    nonnegative=nonnegative)
        solved = project(problem, tol=tol, feasibility=feasibility, max_iter=max_iter, time_limit=remaining)
        r, mu, nit, stopped, history, time_project = (solved.r, solved.mu, solved.iterations, solved.stopped,
                                                      solved.history, solved.time)
        if loose:  # the loose attributes' cells are N / n_a: within bounds when the total is
            mu = family.expand(r)
            if nonnegative and -float(mu.min(initial=0.0)) > feasibility:
                solved.converged, solved.violation = False, -float(mu.min(initial=0.0))
        what = "marginal polytope: the marginals are decomposable" if polytope == "marginal" else \
            "local polytope: a relaxation"
        methods = ", then ".join(solved.methods) or "no solver: the fit needed none"
        if solved.converged:
            status = Status.OPTIMAL
            message = (f"certified ({what}): relative duality gap {solved.gap:.1e} (tolerance {tol:g}), largest "
                       f"violation {solved.violation:.1e} (tolerance {feasibility:.1e}); {nit} iterations "
                       f"({methods})")
        else:
            status = Status.TIME_LIMIT if stopped == "time limit" else Status.NUMERICAL_ERROR
            message = (f"not certified ({stopped}): relative duality gap {solved.gap:.1e} (tolerance {tol:g}), "
                       f"largest violation {solved.violation:.1e} (tolerance {feasibility:.1e}) after {nit} "
                       f"iterations ({methods}); the point is kept as an incumbent, not an estimate")
        certificate = {"gap": solved.gap, "tol": tol, "violation": solved.violation, "feasibility_tol": feasibility,
                       "primal": solved.fun, "dual": solved.dual, "ok": solved.converged}
    measured_family = SetFamily(index, [a for a, m in zip(all_axes, measurements) if m.variance > 0])
    chi_square = _chi_square(measured_family, r, [m for m in measurements if m.variance > 0])
    info = {
        "certificate": certificate, "polytope": polytope, "cliques": len(cliques), "clique_cells": int(family.size),
        "residual_sets": int(index.num_sets), "residual_cells": int(index.size),
        "unmeasured_residual_sets": int(unmeasured.sum()), "fixed_residual_sets": int(fit.fixed.sum()),
        "prior_ratio": PRIOR_RATIO, "curvature": None if problem is None else problem.lipschitz,
        "loose_attributes": [domain.attrs[a] for (a,) in loose], "shrinkage": shrinkage,
        "interior_point": interior is not None, "stopped": stopped,
        "time_fit": time_fit, "time_project": time_project, "total_public": total_choice.mode == "public",
        "total": total_choice.info(), "history": history,
    }
    solver = (f"dpopt.estimate.reconstruct ({certificate.get('backend')})" if polytope == "table" else
              "residual least squares, then the projection onto the polytope by "
              f"{methods}")
    if total_choice.mode != "public":
        message = f"{message}; total {total_choice.reason}"
    return MarginalEstimate(
        status=status, success=status is Status.OPTIMAL, message=message, fun=chi_square, objective="l2",
        backend="marginal_space", solver=solver,
        domain=domain, workload=tuple(tuple(domain.attrs[a] for a in w) for w in work),
        cliques=tuple(tuple(domain.attrs[a] for a in c) for c in cliques), index=index, family=family,
        residuals=r, clique_marginals=mu, total=float(r[index.set_offsets[index.position_of(())]]), table=table,
        measurements=measurements, constraints=constraints, nit=nit,
        time=time.perf_counter() - start, incumbent=status is not Status.OPTIMAL, info=info,
        residual_weights=fit.weight)


def _solve_table(measurements, constraints, total, nonnegative, time_limit, family: SetFamily,
                 held_total: float | None = None):
    """The dense route: :func:`dpopt.estimate.reconstruct` (weighted least squares under the
    constraints, certified by its engine), and the residuals of its table (``adjoint / diagonal``
    of the cliques' marginals, which are consistent). ``held_total``: the measured total held
    (:mod:`~dpopt.estimate.marginal_space.total`), as an equality like a public one."""
    from dpopt.estimate import reconstruct
    from dpopt.model.constraints import Invariant, NonNegativity

    domain = family.index.domain
    cs = ConstraintSet(domain, list(constraints.constraints) if constraints is not None else [])
    if nonnegative and not cs.nonnegative:
        cs.add(NonNegativity())
    if total is not None:
        cs.add(Invariant(Total(domain), np.array([float(total)]), name="public total"))
    elif held_total is not None:
        cs.add(Invariant(Total(domain), np.array([float(held_total)]), name="measured total (held)"))
    result = reconstruct(measurements, cs, "l2", time_limit=time_limit, integer=False)
    certificate = {"dense": True, "backend": result.backend, "status": result.status.name,
                   "max_violation": result.max_violation, "ok": bool(result.success)}
    note = f"the full table ({domain.size:,} cells) fits: solved densely ({result.backend}): {result.message}"
    if result.x is None:
        return (np.zeros(family.index.size), np.zeros(family.size), result.status, note, certificate,
                result.nit, result.status.name, None)
    x = np.asarray(result.x, dtype=np.float64)
    mu = family.pack([Marginal(domain, [domain.attrs[a] for a in s]).matvec(x) for s in family.sets])
    r = family.adjoint(mu) / family.index.per_set(family.diagonal())
    status = result.status if result.success else (result.status if result.status is not Status.OPTIMAL
                                                   else Status.NUMERICAL_ERROR)
    return r, family.expand(r), status, note, certificate, result.nit, result.status.name, x


def _constraint_parts(constraints: ConstraintSet, domain: Domain):
    """``(zero patterns [(axes, mask)], exact marginals [(axes, values, name)])`` of public constraints."""
    if not isinstance(constraints, ConstraintSet):
        raise ParameterError(f"constraints must be a ConstraintSet, got {type(constraints).__name__}")
    if constraints.domain != domain:
        raise QueryError(f"constraints are over {constraints.domain}, not the measurements' {domain}")
    if constraints.inequalities:
        raise ParameterError("marginal-space estimation keeps non-negativity, structural zeros, hierarchies and "
                             f"invariants on marginals, not inequalities ({constraints.inequalities[0].key!r})")
    constraints.check()
    zeros = []
    for _, attrs, mask in constraints.zero_patterns():
        zeros.append((tuple(sorted(domain.axes(attrs))), np.asarray(mask, dtype=bool)))
    exact = []
    for inv in constraints.invariants:
        q = inv.query
        if isinstance(q, Marginal):
            axes = tuple(sorted(domain.axes(q.attrs)))
        elif isinstance(q, Total):
            axes = ()
        elif isinstance(q, Identity):
            axes = tuple(range(len(domain)))
        else:
            raise QueryError(f"invariant {inv.name!r} is on {q.name}: marginal-space estimation keeps invariants on "
                             "marginals, totals and the identity only")
        exact.append((axes, np.asarray(inv.values, dtype=np.float64), f"invariant {inv.name!r}"))
    return zeros, exact


def _zero_cells(family: SetFamily, zeros, sizes: np.ndarray) -> np.ndarray:
    """Flat mask over the clique cells: cells whose projection on a zero pattern's attributes is forbidden."""
    mask = np.zeros(family.size, dtype=bool)
    for group in family.groups:
        view = family.view(mask, group)
        for axes, forbidden in zeros:
            held = np.isin(group.axes, axes).sum(axis=1) == len(axes)
            rows = np.flatnonzero(held)
            if not rows.size:
                continue
            forbidden = np.asarray(forbidden, dtype=bool).reshape([int(sizes[a]) for a in axes])
            for row in rows:  # loop over the cliques holding the pattern (few), never over cells
                positions = [int(np.flatnonzero(group.axes[row] == a)[0]) for a in axes]
                shape = [1] * len(group.sizes)
                for p, a in zip(positions, axes):
                    shape[p] = int(sizes[a])
                view[row] |= forbidden.reshape(shape)
    return mask


def _chi_square(family: SetFamily, r: np.ndarray, measurements: list[Measurement]) -> float:
    """``sum_S ||y_S - mu_S||² / sigma_S²`` at residuals ``r`` (dpopt's L2 objective value)."""
    if not measurements:
        return 0.0
    mu = family.expand(r)
    y = family.pack([m.values for m in measurements])
    w = family.per_set(np.array([1.0 / m.variance for m in measurements]))
    return float(np.sum(w * (mu - y) ** 2))
