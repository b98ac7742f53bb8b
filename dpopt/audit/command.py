"""``dpopt audit SPEC [--runs N] [--domain-limit K] [--out DIR]``: the command's parser and body.

Kept here so that :mod:`dpopt.cli` only adds the sub-parser and dispatches.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "main"]


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``audit`` sub-command to ``dpopt``'s sub-parsers."""
    from dpopt.audit.defaults import DEFAULT_DOMAIN_LIMIT, DEFAULT_RUNS  # not the audit itself: --help stays quick

    cmd = sub.add_parser("audit", help="statistically audit a spec's privacy on tiny synthetic datasets",
                         description="Run the spec's algorithm many times on neighbouring tiny datasets over its "
                                     "(down-scaled) domain, search for the most telling output event and test it: "
                                     "prints the claimed epsilon, a lower bound on the true one, the events and a "
                                     "plot. Never reads the spec's data.")
    cmd.add_argument("spec", metavar="SPEC", help="a release spec (TOML file) or a built-in name")
    cmd.add_argument("--runs", metavar="N", type=_at_least(4), default=DEFAULT_RUNS,
                     help=f"runs of each dataset of the worst pair, half for the event search and half for the test "
                          f"(default {DEFAULT_RUNS})")
    cmd.add_argument("--domain-limit", metavar="K", type=_at_least(2), default=DEFAULT_DOMAIN_LIMIT,
                     help=f"at most K cells in the audit domain (default {DEFAULT_DOMAIN_LIMIT})")
    cmd.add_argument("--out", metavar="DIR",
                     help="where to write the audit report (default: beside the release, <release dir>-audit)")
    return cmd


def main(args: argparse.Namespace) -> int:
    """Run ``dpopt audit``; exit status 0 when no violation is found, 3 when one is."""
    from dpopt.audit.spec import audit_dir, audit_spec
    from dpopt.spec import load_spec

    spec = load_spec(args.spec)
    out = args.out or audit_dir(spec)
    report = audit_spec(spec, runs=args.runs, domain_limit=args.domain_limit, out=out, echo=print,
                        progress=sys.stderr.isatty())
    print("\n".join(report.lines()))
    print(f"dpopt: wrote the audit report to {out}/ (report.json, summary.md, plots/output_distributions.png)")
    return 0 if report.passed and (report.conditional is None or report.conditional.passed) else 3


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse
