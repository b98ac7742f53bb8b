"""The ``dpopt`` command line.

::

    dpopt run SPEC [--data PATH] [--out DIR] [--seed N] [--evaluate] [--overwrite] [--quiet] [--verbose]
              [--show-confidential]
    dpopt check SPEC [--data PATH] [--show-confidential]
    dpopt models
    dpopt example-data --rows N --seed S --out PATH [--format csv|parquet] [--overwrite]
    dpopt audit SPEC [--runs N] [--domain-limit K] [--out DIR]

``SPEC`` is a TOML file or the name of a built-in spec (``dpopt models`` lists them).
Input errors print one line, ``dpopt: error: ...`` naming the file, line and key, and exit
with status 2 (usage errors) or 1 (everything else); no traceback for dpopt's own errors.
SIGTERM, SIGHUP and SIGINT stop a run with one line and status 128 + the signal number
(143, 129, 130), leaving nothing behind. A seeded or ``--evaluate`` run prints its NOT
private warning on stderr even with ``--quiet``. dpopt's warnings are printed as one line each,
``dpopt: warning: ...``. No message quotes a value of the confidential data unless
``--show-confidential`` is given, and none ever says how many rows hold one.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import Sequence

from dpopt.atomic import Interrupted, handle_signals
from dpopt.errors import DpoptError

EXIT_ERROR = 1
EXIT_USAGE = 2
SHOW_CONFIDENTIAL_HELP = ("let errors about the data quote its offending values (never how many rows hold them); "
                          "off by default, since messages end up in shared logs")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    import dpopt

    parser = argparse.ArgumentParser(
        prog="dpopt",
        description="Differentially private data release: noisy measurement plus consistency optimization.",
    )
    parser.add_argument("--version", action="version", version=f"dpopt {dpopt.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run a release spec and write the release",
                         description="Validate SPEC, read the data, measure with exact noise, reconstruct "
                                     "under the constraints and write the release atomically.")
    run.add_argument("spec", metavar="SPEC", help="a release spec (TOML file) or a built-in name")
    run.add_argument("--data", metavar="PATH", help="read the data from this CSV/Parquet file instead of the spec's source")
    run.add_argument("--out", metavar="DIR",
                     help="output directory (default: output.dir of the spec, else dpopt-out/<name>)")
    run.add_argument("--seed", metavar="N", type=_seed, help="seed the privacy noise: reproducible and NOT private")
    run.add_argument("--evaluate", action="store_true",
                     help="also report errors against the confidential data (NOT private; for testing)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace DIR if it holds a previous dpopt release and nothing else")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="print nothing but errors and the NOT-private warning of a seeded or evaluated run")
    run.add_argument("--verbose", "-v", action="store_true", help="let the solvers print their own logs")
    run.add_argument("--show-confidential", action="store_true", help=SHOW_CONFIDENTIAL_HELP)

    check = sub.add_parser("check", help="validate a spec and print the plan, without reading data",
                           description="Validate SPEC, build its public parts, check the constraints and print "
                                       "the plan and the budget split. No data are read.")
    check.add_argument("spec", metavar="SPEC", help="a release spec (TOML file) or a built-in name")
    check.add_argument("--data", metavar="PATH", help="the data file the run would read (checked to exist only)")
    check.add_argument("--show-confidential", action="store_true", help=SHOW_CONFIDENTIAL_HELP)

    sub.add_parser("models", help="list the built-in release specs", description="List the specs in models/.")

    ex = sub.add_parser("example-data", help="write the generated census-like example data",
                        description="Write dpopt's made-up census-like person file (see docs: Example data).")
    ex.add_argument("--rows", metavar="N", type=_positive_int, default=10_000, help="number of persons (default 10000)")
    ex.add_argument("--seed", metavar="S", type=_seed, default=0, help="seed of the generator (default 0)")
    ex.add_argument("--out", metavar="PATH", required=True, help="file to write (.csv or .parquet)")
    ex.add_argument("--format", choices=("csv", "parquet"), help="default: from the extension of PATH")
    ex.add_argument("--states", metavar="K", type=_positive_int, default=4, help="number of states (default 4)")
    ex.add_argument("--counties-per-state", metavar="K", type=_positive_int, default=3,
                    help="counties in each state (default 3)")
    ex.add_argument("--overwrite", action="store_true", help="replace PATH if it exists")

    from dpopt.audit.command import add_parser as add_audit_parser

    add_audit_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpopt`` command; returns the exit status.

    Called without ``argv`` -- the installed ``dpopt`` script, ``python -m dpopt.cli`` -- it
    ends the process itself once the command is done and its output flushed, without the
    interpreter's teardown (:func:`_fast_exit`). Called with ``argv`` (tests, Python callers) it
    returns.
    """
    status = _main(argv)
    if argv is None:
        _fast_exit(status)
    return status


def _fast_exit(status: int) -> None:
    """Flush stdout and stderr, shut logging down, then ``os._exit(status)``.

    A normal exit tears the interpreter down: it frees every object of pandas, pyarrow, scipy
    and matplotlib one by one, 0.3-0.4 CPU-s after the quickstart's release is already written
    (a fifth of its run; issue #30). Nothing is left to do by then: every file dpopt writes is
    closed and committed (:mod:`dpopt.atomic`), worker pools and Spark sessions are closed by
    their ``with`` blocks, the figures' child process is reaped, and the only other thread (the
    solver thread) is a daemon. mypy ends its runs the same way (``mypy.util.hard_exit``).
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what the normal exit would have lost too
            pass
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(status)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with handle_signals(), _warnings_on_one_line():
            if args.command == "run":
                return _run(args)
            if args.command == "check":
                return _check(args)
            if args.command == "models":
                return _models()
            if args.command == "audit":
                from dpopt.audit.command import main as audit_main

                return audit_main(args)
            return _example_data(args)
    except DpoptError as exc:
        print(f"dpopt: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:  # a file that cannot be read or written: the system's words suffice
        print(f"dpopt: error: {_one_line(exc)}; nothing was written", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError as exc:  # beyond the plan's estimate (dpopt.release.resources): still one line
        print(f"dpopt: error: out of memory ({_one_line(exc) or 'MemoryError'}); nothing was written; "
              "`dpopt check` prints the plan's memory estimate", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else 2
        name = exc.name if isinstance(exc, Interrupted) else "SIGINT"
        written = getattr(exc, "written", None)
        what = f"the release in {str(written)!r} is complete" if written else "nothing was written"
        print(f"dpopt: interrupted by {name}; {what}", file=sys.stderr)
        return 128 + signum


# ---- commands ---------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from dpopt.release import run
    from dpopt.spec import load_spec

    from dpopt.release.pipeline import NotPrivateWarning

    start = time.perf_counter()
    spec = load_spec(args.spec)
    out = Path(args.out) if args.out else (spec.output.dir or Path("dpopt-out") / spec.name)
    seed = spec.privacy.seed if args.seed is None else args.seed
    reasons = ([f"the noise is seeded (seed {seed})"] if seed is not None else []) + \
        (["--evaluate compares it with the confidential data"] if args.evaluate else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotPrivateWarning)  # said below, in one line
        release = run(spec, data=args.data, out=out, seed=args.seed, evaluate=args.evaluate,
                      overwrite=args.overwrite, progress=not args.quiet and sys.stderr.isatty(),
                      verbose=args.verbose, show_confidential=args.show_confidential, plot_process=True)
    if reasons:  # on stderr, even with --quiet: a reader of the files must not take them for private
        print(f"dpopt: warning: the release in {str(out)!r} is NOT private: {' and '.join(reasons)}; "
              f"do not publish it", file=sys.stderr)
    if not args.quiet:
        print(_run_summary(release, time.perf_counter() - start))
    return 0


def _run_summary(release, seconds: float) -> str:
    r = release.report
    pr = r["privacy"]
    rc = r["reconstruction"]
    rel = r["released"]
    budget = ", ".join(f"{k} = {v}" for k, v in pr["budget"].items())
    what = (f"{rel['cells']:,} cells, total {rel['total']:,.0f}" if rel["total"] is not None else  # a table, or
            f"{len(rel['answers']):,} answer tables ({sum(rel['answers'].values()):,} answers), no table")
    lines = [
        f"dpopt: released {release.spec.name!r}: {what}"
        + (f", {rel['synthetic_rows']:,} synthetic records" if rel["synthetic_rows"] is not None else ""),
        f"  privacy: {pr['accounting']} {budget}; ledger "
        + ("sums exactly to the budget" if pr["ledger_sums_to_budget"] else
           "leaves " + ", ".join(f"{k} = {v}" for k, v in pr["unspent"].items()) + " unspent"),
        (f"  reconstruction: {rc['objective']} with {rc['backend']} ({rc['solver']}), {rc['status']} "
         if rc["objective"] else f"  algorithm: {rc['backend']} ({rc['solver']}), {rc['status']} ")
        + f"in {rc['time_seconds']:.2f} s" + (f"; rounded ({rc['rounding']['method']})" if "rounding" in rc else ""),
        (f"  constraints: {sum(c['satisfied'] for c in r['constraints'])} of {len(r['constraints'])} hold "
         f"(largest violation {r['max_violation']:.3g})" if r["constraints"] else "  constraints: none declared"),
    ]
    if r["randomness"]["seeded"]:
        lines.append(f"  WARNING: noise seed {r['randomness']['seed']}: seeded, NOT private")
    if r.get("evaluation"):
        s = r["evaluation"]["summary"]
        lines.append(f"  evaluation (NOT private): total variation {s['total_variation']:.4f}, "
                     f"L1 error of the table {s['l1_full_table']:,.0f}" if "total_variation" in s else
                     f"  evaluation (NOT private): {s['queries_evaluated']} marginals, mean relative L1 error "
                     f"{s['mean_relative_l1']:.4f}")
    lines.append(f"  wrote {release.out}/ ({len(r.get('files', []))} files) in {seconds:.1f} s; "
                 f"see {release.out}/summary.{'md' if 'md' in release.spec.output.summary else 'html'}"
                 if release.spec.output.summary else f"  wrote {release.out}/ in {seconds:.1f} s")
    return "\n".join(lines)


def _quick_heading(path: str) -> list[str] | None:
    """The lines of :func:`dpopt.release.plan.describe_heading` read from a spec file with
    ``tomllib`` alone; None (the full load prints them) for built-in names or anything unusual."""
    import tomllib
    from pathlib import Path

    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name, description = raw.get("name"), raw.get("description")
    if not isinstance(name, str) or not name.strip() or not isinstance(description, (str, type(None))):
        return None
    return [f"release {name!r} ({path})"] + ([f"  {description}"] if description else [])


def _check(args: argparse.Namespace) -> int:
    # The heading straight from the TOML, before the algorithms (scipy, pandas) are imported: the
    # first line within a fraction of a second; the full load below validates everything.
    heading = _quick_heading(args.spec)
    if heading:
        print("\n".join(heading), flush=True)
    from dpopt.release.plan import describe_heading, plan
    from dpopt.spec import load_spec

    spec = load_spec(args.spec)
    if not heading:
        print("\n".join(describe_heading(spec)), flush=True)  # at once: the plan may take a while
    p = plan(spec, data=args.data, require_data=False,
             show_confidential=args.show_confidential)  # the data file is the run's business (or --data's)
    print(p.describe(heading=False))
    print("spec OK: nothing was read or written")
    return 0


def _models() -> int:
    from dpopt.spec import list_models, load_spec, models_dir

    paths = list_models()
    if not paths:
        print(f"no built-in specs found in {models_dir()}")
        return 0
    for path in paths:
        try:
            spec = load_spec(path)
            about = spec.description
        except DpoptError as exc:
            about = f"(invalid: {_one_line(exc)})"
        print(f"{path.stem:<20} {about}")
        print(f"{'':<20} {path}")
    return 0


def _example_data(args: argparse.Namespace) -> int:
    from dpopt.datasets.census import write_example_data

    path = Path(args.out)
    fmt = args.format or _format_from_name(path)
    if path.exists() and not args.overwrite:
        raise DpoptError(f"--out: {str(path)!r} exists; choose another file or pass --overwrite to replace it")
    start = time.perf_counter()
    write_example_data(path, num_people=args.rows, seed=args.seed, format=fmt,
                       num_states=args.states, counties_per_state=args.counties_per_state)
    print(f"dpopt: wrote {args.rows:,} example records to {path} ({fmt}, seed {args.seed}) "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


def _format_from_name(path: Path) -> str:
    """The format of a file to be written, from its extension (it has no content yet)."""
    from dpopt.errors import SpecError

    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        return "parquet"
    if suffixes and (suffixes[-1] in (".csv", ".txt") or suffixes[-2:] == [".csv", ".gz"]):
        return "csv"
    raise SpecError(f"--out: cannot tell the format of {str(path)!r} from its extension; use .csv or .parquet, "
                    "or give --format")


# ---- argument types ---------------------------------------------------------------------------


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _seed(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@contextlib.contextmanager
def _warnings_on_one_line():
    """dpopt's own warnings as ``dpopt: warning: ...`` lines on stderr; others as Python prints them."""
    package = str(Path(__file__).resolve().parent)
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if str(Path(filename).resolve()).startswith(package):
            print(f"dpopt: warning: {_one_line(message)}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = default


if __name__ == "__main__":  # python -m dpopt.cli
    sys.exit(main())
