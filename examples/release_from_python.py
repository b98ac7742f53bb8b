"""A whole release from Python: the quickstart spec as a dict, changed, run and written.

    python examples/release_from_python.py [OUTPUT_DIR]

Teaches: everything `dpopt run` does is one call, `dpopt.release.run`, whose spec may be a
dict; the results are pandas DataFrames, and the release is written atomically.
The noise is seeded so that the printout is reproducible: a seeded run is NOT private.
"""

from __future__ import annotations

import sys
import tempfile
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

from dpopt.release import run

QUICKSTART = Path(__file__).resolve().parents[1] / "models" / "quickstart.toml"


def main() -> None:
    with open(QUICKSTART, "rb") as fh:
        spec = tomllib.load(fh)
    spec["name"] = "quickstart-l1"
    spec["reconstruct"]["objective"] = "l1"      # least absolute deviations instead of least squares
    spec["output"]["formats"] = ["csv"]

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "release"
    release = run(spec, out=out, seed=3, evaluate=True)   # seeded and evaluated: NOT private

    print(release.ledger[["label", "epsilon", "cumulative_epsilon"]].to_string(index=False))
    print()
    print(release.table[release.table["count"] > 0].head(8).to_string(index=False))
    print()
    ev = release.evaluation
    print(ev[ev["kind"] == "measured"][["query", "l1_error", "noisy_l1_error"]].to_string(index=False))
    print(f"\nwrote {sorted(p.name for p in out.iterdir())} to {out}")


if __name__ == "__main__":
    main()
