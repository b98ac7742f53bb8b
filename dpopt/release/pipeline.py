"""The release pipeline behind ``dpopt run``: plan → load → constrain → algorithm → outputs → report.

Each step is a function that can be called on its own::

    p = plan("models/quickstart.toml")               # public objects; constraints checked; no data
    data = load_data(p)                              # the confidential records
    constraints = build_constraints(p, data)         # + invariants published from the data; checked
    release = run_algorithm(p, data, constraints)    # the registered algorithm: budget charged, noise drawn

or all at once with :func:`run`, which also builds tables, synthetic records, the report and,
given ``out``, writes everything atomically (a failed run leaves nothing behind).

Order matters for privacy and for the "nothing written" promise: the whole spec is validated
and the public constraints are checked before any data is read; constraints that take values
from the data are checked right after computing them and still before any noise is drawn; every
mechanism charges the accountant before it samples; outputs are written to a temporary
directory that replaces the target only when everything succeeded.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

from dpopt.algorithms.base import Release
from dpopt.errors import DataError, DpoptError, SolverError, confidential_values_shown
from dpopt.model.constraints import ConstraintSet
from dpopt.model.data import Dataset
from dpopt.release.evaluate import evaluate_release, evaluate_without_table
from dpopt.release.outputs import ReleaseResult, released_table, synthesize, write_release
from dpopt.release.plan import NO_DATA, ReleasePlan, check_constraints, error_class, plain, plan
from dpopt.spec import ReleaseSpec

__all__ = ["load_data", "build_constraints", "run_algorithm", "run", "measure", "reconstruct_table",
           "NotPrivateWarning"]


class NotPrivateWarning(UserWarning):
    """A release computed with seeded noise or evaluated against the confidential data: do not publish it."""


def load_data(p: ReleasePlan) -> Dataset:
    """Read (or generate) the confidential records of a planned release.

    Records that fall in a cell a structural zero (or hierarchy) forbids are an error naming
    the rules they break (never how many records), unless the spec says
    ``[constraints] structural_zero_records = "drop"``: then they are dropped, and the report
    says so without the count. Errors quote the data's offending values only when the plan was
    made with ``show_confidential=True`` (:mod:`dpopt.errors`).
    """
    from dpopt.release.checks import warn_before_spending

    with confidential_values_shown(p.show_confidential):
        data, what = _load_data(p)
    warn_before_spending(p, data, what)
    return data


def _load_data(p: ReleasePlan) -> tuple[Dataset, str]:
    spec, domain = p.spec, p.domain
    if p.data_source == "none":  # planned with require_data=False
        raise spec.error(("data", "path"), NO_DATA)
    if p.data_source == "given":
        d = p.data_given
        data = d if isinstance(d, Dataset) else _wrap_data(lambda: Dataset.from_frame(d, domain), "data")
        return _screen_zero_cells(p, data, "data"), "the data"
    if p.data_source == "example":
        from dpopt.datasets.census import generate_census

        df = generate_census(spec.data.rows, num_states=spec.domain.states,
                             counties_per_state=spec.domain.counties_per_state, seed=spec.data.seed)
        return _screen_zero_cells(p, Dataset.from_frame(df, domain), "the example data"), "the example data"
    kwargs = {"weight_column": spec.data.count_column} if spec.data.count_column else {}
    if p.data_format == "csv":
        kwargs["missing_values"] = spec.data.missing_values
        reader = Dataset.from_csv
    else:
        reader = Dataset.from_parquet
    data = _wrap_data(lambda: reader(p.data_path, domain, **kwargs), str(p.data_path))
    return _screen_zero_cells(p, data, f"data {p.data_path}"), f"data {p.data_path}"


def _screen_zero_cells(p: ReleasePlan, data: Dataset, what: str) -> Dataset:
    if not p.constraints.zero_rules:
        return data
    if p.spec.constraints.structural_zero_records == "drop":
        return p.constraints.without_zero_cell_records(data)
    hits = [rule for rule, count in p.constraints.zero_cell_records(data) if count]
    if not hits:
        return data
    named = ", ".join(repr(rule.key) for rule in hits[:3])
    more = f" (and {len(hits) - 3} more rules)" if len(hits) > 3 else ""
    raise DataError(f"{what}: records fall in cells that {named}{more} forbid; fix the data, or set "
                    "[constraints] structural_zero_records = \"drop\" to drop them (the report then says so, "
                    "without the count)")


def _wrap_data(read, what: str) -> Dataset:
    try:
        return read()
    except DpoptError as exc:
        raise type(exc)(f"data {what}: {plain(exc)}") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"data {what}: cannot be read: {exc}") from None


def build_constraints(p: ReleasePlan, data: Dataset) -> ConstraintSet:
    """The plan's public constraints plus the invariants published from the data, checked.

    Runs before any noise is drawn: an inconsistency stops the release with nothing spent.
    """
    if not p.data_invariants:
        return p.constraints
    cs = ConstraintSet(p.domain, list(p.constraints.constraints))
    for name, query, path in p.data_invariants:
        try:
            cs.invariant_from_data(query, data, name)
        except DpoptError as exc:
            raise p.spec.error(path, plain(exc), error_class(exc)) from None
    check_constraints(p.spec, cs, when="with the invariants computed from the data, before any noise")
    return cs


def run_algorithm(p: ReleasePlan, data: Dataset, constraints: ConstraintSet, *, accountant=None, rng=None,
                  verbose: bool = False) -> Release:
    """Run the spec's algorithm on the confidential data: charge the budget, draw, release.

    Raises the error of the algorithm's spec section (a :class:`SolverError` for a solve or a
    rounding that did not succeed): a release never publishes an unsolved estimate.
    ``verbose`` lets the solvers print their own logs (when the engines take a ``verbose``
    keyword; see :func:`solver_verbosity`).
    """
    from dpopt.privacy.randomness import make_random

    accountant = accountant or p.new_accountant()
    rng = rng or make_random(p.seed)
    algorithm = p.algorithm
    try:
        with solver_verbosity(verbose), confidential_values_shown(p.show_confidential):
            release = algorithm.run(p.algorithm_plan.with_constraints(constraints), data, accountant, rng)
    except DpoptError as exc:
        key = getattr(exc, "spec_path", None) or (next(iter(algorithm.sections), "algorithm"),)
        raise p.spec.error(key, plain(exc), type(exc)) from None
    if not release.success:
        key = release.info.get("spec_key") or (next(iter(algorithm.sections), "algorithm"),)
        raise p.spec.error(key, release.message, SolverError)
    release["rng"] = rng
    return release


@contextlib.contextmanager
def _plot_child(wanted: bool):
    """The figures' child process (:class:`~dpopt.release.plot_worker.PlotWorker`), started before
    any data is read so that it imports matplotlib while this process computes the release;
    None when not ``wanted`` or without fork. Killed and reaped however the block ends."""
    if not wanted:
        yield None
        return
    from dpopt.release.plot_worker import PlotWorker

    worker = PlotWorker.start()
    try:
        yield worker
    finally:
        if worker is not None:
            worker.close()


class _NoBar:
    """What :func:`run` needs of a tqdm bar, doing nothing: without ``progress`` the run does not
    import tqdm (0.05-0.1 s of the quickstart's 2 s, issue #30)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass


@contextlib.contextmanager
def _progress_bar(progress: bool, steps: int):
    """A tqdm bar on stderr over ``steps`` steps when ``progress``, else a :class:`_NoBar`."""
    if not progress:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=steps, desc="dpopt", unit="step", file=sys.stderr, leave=False) as bar:
        yield bar


@contextlib.contextmanager
def solver_progress(bar):
    """Within the block, long solves report their certified points on ``bar``'s postfix
    (:data:`~dpopt.estimate.progress.SOLVER_PROGRESS`); ``bar`` None: they report nothing."""
    from dpopt.estimate.progress import SOLVER_PROGRESS

    token = SOLVER_PROGRESS.set(None if bar is None else bar.set_postfix_str)
    try:
        yield
    finally:
        SOLVER_PROGRESS.reset(token)


@contextlib.contextmanager
def solver_verbosity(verbose: bool):
    """Within the block, :func:`dpopt.estimate.reconstruct` defaults to ``verbose`` (its
    :data:`~dpopt.estimate.SOLVER_VERBOSE` context variable): algorithms call ``reconstruct``
    themselves, so the pipeline cannot pass the keyword. Solver banners are otherwise silenced
    by the engines."""
    from dpopt.estimate import SOLVER_VERBOSE

    token = SOLVER_VERBOSE.set(bool(verbose))
    try:
        yield
    finally:
        SOLVER_VERBOSE.reset(token)


def run(
    spec: "str | Path | Mapping | ReleaseSpec",
    data: Any = None,
    out: str | Path | None = None,
    seed: int | None = None,
    evaluate: bool = False,
    *,
    overwrite: bool = False,
    progress: bool = False,
    verbose: bool = False,
    show_confidential: bool = False,
    plot_process: bool = False,
) -> ReleaseResult:
    """Run a whole release: validate, read, check, run the algorithm, report, write.

    Parameters
    ----------
    spec
        TOML path, built-in name (``"quickstart"``), dict or :class:`ReleaseSpec`.
    data
        Overrides the spec's data: a CSV/Parquet path, a DataFrame or a Dataset.
    out
        Directory to write the release to (atomically). None: write nothing.
    seed
        Seed of the privacy noise. A seeded run is reproducible and NOT private; the
        report says so.
    evaluate
        Also compare the release with the confidential data (NOT private; for testing).
    overwrite
        Replace an existing non-empty ``out``.
    progress
        Show a progress bar (tqdm) on stderr.
    verbose
        Let the solvers print their logs (see :func:`solver_verbosity`).
    show_confidential
        Let errors about the data quote its offending values (never how many rows hold them).
        Off by default: messages end up in shared logs (:mod:`dpopt.errors`).
    plot_process
        Draw the figures in a child process forked after the plan, which imports matplotlib
        while the release is computed (:mod:`dpopt.release.plot_worker`; Linux, else ignored).
        What ``dpopt run`` does: one release per process then waits 0.5 CPU-s less. Off by
        default: a process that makes many releases imports matplotlib once, in itself.

    Returns
    -------
    ReleaseResult
        The algorithm's :class:`~dpopt.algorithms.base.Release` with the pipeline's outputs.

    Warns
    -----
    NotPrivateWarning
        (a ``UserWarning``) when the run is seeded or evaluated: its outputs are not private.
    """
    from dpopt.report import build_report

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    p = plan(spec, data=data, seed=seed, out=out, overwrite=overwrite, show_confidential=show_confidential)
    lap("plan")
    reasons = ([f"the noise is seeded (seed {p.seed})"] if p.seed is not None else []) + \
        (["it is evaluated against the confidential data"] if evaluate else [])
    if reasons:
        warnings.warn(f"release {p.spec.name!r} is NOT private: {' and '.join(reasons)}; do not publish it",
                      NotPrivateWarning, stacklevel=2)
    steps = 5 + (1 if evaluate else 0) + (1 if out is not None else 0)
    with _progress_bar(progress, steps) as bar, \
            _plot_child(plot_process and out is not None and p.spec.output.plots) as plot_worker:
        def step(name: str) -> None:
            bar.set_description(name)

        step("reading data")
        data_set = load_data(p)
        bar.update(1)
        lap("load data")
        step("checking constraints")
        constraints = build_constraints(p, data_set)
        bar.update(1)
        lap("constraints")
        step(f"running {p.algorithm.name}")
        with solver_progress(bar if progress else None):
            algorithm_release = run_algorithm(p, data_set, constraints, verbose=verbose)
        bar.set_postfix_str("")
        release = ReleaseResult(algorithm_release)
        bar.update(1)
        lap(p.algorithm.name)
        step("synthesizing")
        counts = release.counts
        release.update(plan=p, constraints=constraints, marginals=release.answers,
                       table=released_table(p, counts) if counts is not None else None)
        if p.spec.output.synthetic and counts is not None:
            try:
                release["synthetic"] = synthesize(p.domain, counts)
            except DataError as exc:
                raise p.spec.error(("output", "synthetic"), plain(exc), DataError) from None
        else:
            release["synthetic"] = release.records
        bar.update(1)
        lap("tables")
        release.update(evaluation=None, evaluation_summary=None, evaluation_truth=None,
                       random_description=release.rng.description, random_is_private=release.rng.is_private)
        if evaluate:
            step("evaluating")
            if counts is not None:
                evaluation, summary, truths = evaluate_release(p, data_set, counts, release.measurements, constraints)
            else:
                evaluation, summary, truths = evaluate_without_table(p, data_set, release)
            bounds = algorithm_release.errors(data_set)
            if bounds is not None and len(bounds):
                summary["algorithm_bounds"] = bounds.to_dict(orient="records")
            release.update(evaluation=evaluation, evaluation_summary=summary, evaluation_truth=truths)
            bar.update(1)
            lap("evaluate")
        release.update(timings=timings, out=None)
        step("reporting")
        release.report = build_report(release)
        bar.update(1)
        lap("report")
        if out is not None:
            step("writing")
            release.out = write_release(release, out, overwrite=overwrite, plot_worker=plot_worker)
            bar.update(1)
            lap("write")
        bar.update(1)
    release.report["timings"] = dict(timings)
    return release


# ---- the default pipeline's two steps, one at a time ----------------------------------------------
def measure(p: ReleasePlan, data: Dataset, *, accountant=None, rng=None, progress=None):
    """Take the planned ``[[measure]]`` measurements: charge the budget, then add exact noise.

    Returns the measurements, the accountant (its ledger sums exactly to what was spent) and the
    random source (``rng.is_private`` is False for seeded runs).
    """
    from dpopt.privacy.mechanisms import measure as measure_query
    from dpopt.privacy.randomness import make_random

    if not p.measures:
        raise SolverError(f"measure() takes the [[measure]] tables; algorithm = {p.algorithm.name!r} chooses "
                          "its own measurements: use run() or run_algorithm()")
    accountant = accountant or p.new_accountant()
    rng = rng or make_random(p.seed)
    out = []
    for m in p.measures:
        out.append(measure_query(m.query, data, m.law, accountant, rng, label=m.label))
        if progress is not None:
            progress.update(1)
    return out, accountant, rng


def reconstruct_table(p: ReleasePlan, measurements, constraints: ConstraintSet):
    """Solve the consistency problem of the spec's ``[reconstruct]`` settings (rounded when integral).

    Returns the :class:`~dpopt.estimate.result.Result`; raises :class:`SolverError` naming the
    ``reconstruct`` section when the solve (or the rounding) does not succeed.
    """
    from dpopt.estimate import reconstruct

    rc = p.spec.reconstruct
    try:
        result = reconstruct(measurements, constraints, rc.objective, backend=rc.backend, time_limit=rc.time_limit)
    except DpoptError as exc:
        raise p.spec.error(("reconstruct",), plain(exc), type(exc)) from None
    if not result.success or result.x is None:
        status = getattr(result.status, "name", result.status)
        raise p.spec.error(("reconstruct",), f"the {rc.objective} solve ({result.backend}) ended with status "
                           f"{status}: {result.message}", SolverError)
    return result
