"""Foundation benchmark (issue 2): loading, counts, marginals, the fast Walsh-Hadamard transform.

Run:  python examples/benchmarks/bench_foundation.py
Needs ../shared/data (nltcs.csv, adult_pgm.csv, adult_pgm_domain.json).
"""

from __future__ import annotations

import itertools

import numpy as np

from _common import load_adult_pgm, load_binary, peak_memory_mb, print_table, timed
from dpopt.model.queries import Marginal, fast_walsh_hadamard


def main() -> None:
    rows: list = []
    with timed("nltcs: load 21,574 records (CSV -> codes)", rows):
        nltcs = load_binary("nltcs")
    with timed("nltcs: full histogram (2^16 cells)", rows):
        hist = nltcs.histogram()
    triples = list(itertools.combinations(nltcs.domain.attrs, 3))
    with timed(f"nltcs: all {len(triples)} 3-way marginals from the records", rows):
        from_records = [nltcs.marginal(t) for t in triples]
    with timed(f"nltcs: all {len(triples)} 3-way marginals as queries on the histogram", rows):
        from_queries = [Marginal(nltcs.domain, t).matvec(hist) for t in triples]
    assert all(np.array_equal(a, b) for a, b in zip(from_records, from_queries))
    with timed("nltcs: all 65,536 Fourier coefficients (fast WHT)", rows):
        coefficients = fast_walsh_hadamard(hist.astype(np.float64))
    assert coefficients[0] == nltcs.total

    with timed("adult (Private-PGM): load 48,842 records, 14 attributes", rows):
        adult = load_adult_pgm()
    pairs = list(itertools.combinations(adult.domain.attrs, 2))
    with timed(f"adult: all {len(pairs)} 2-way marginals (domain {adult.domain.size:.2e} cells, never built)", rows):
        marginals = [adult.marginal(p) for p in pairs]
    assert all(m.sum() == adult.total for m in marginals)
    print_table(rows, "dpopt foundation benchmark")
    print(f"  peak memory {peak_memory_mb():.0f} MB")


if __name__ == "__main__":
    main()
