"""Time the exact discrete Laplace and Gaussian samplers with the secure random source.

Run:  /work/venv/bin/python examples/benchmarks/bench_samplers.py [--draws 1000000] [--repeats 3]

Prints one row per (law, parameter): draws, best wall time over the repeats, draws per
second, 64-bit words read from os.urandom per draw, and whether the exact big-integer
fallback ran. Rows whose big-integer path is slow use fewer draws (stated in the table).
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

from dpopt.privacy.randomness import SecureRandom
from dpopt.privacy.samplers import discrete_gaussian, discrete_laplace


class CountingSecureRandom(SecureRandom):
    """SecureRandom that counts the words it hands out (for the words/draw column)."""

    def __init__(self) -> None:
        self.count = 0

    def words(self, n: int) -> np.ndarray:
        self.count += int(n)
        return super().words(n)


CASES = [
    # (law, label, parameter, keyword arguments, draws divisor for slow exact paths)
    ("laplace", "scale 10", 10, {}, 1),
    ("laplace", "scale 1", 1, {}, 1),
    ("laplace", "scale 1/2", Fraction(1, 2), {}, 1),
    ("laplace", "scale 3.7 (float, exact)", 3.7, {}, 1),
    ("laplace", "scale 250", 250, {}, 1),
    ("laplace", "scale 10^6", 10**6, {}, 1),
    ("gaussian", "sigma 10 (sigma2 100)", 100, {}, 1),
    ("gaussian", "sigma 1", 1, {}, 1),
    ("gaussian", "sigma 1/2", Fraction(1, 4), {}, 1),
    ("gaussian", "sigma 50 (sigma2 2500)", 2500, {}, 1),
    ("gaussian", "sigma 1000", 10**6, {}, 1),
    ("gaussian", "sigma2 2.3 (float, exact)", 2.3, {}, 4),
    ("gaussian", "sigma2 2.3 (max_denominator 10^6)", 2.3, {"max_denominator": 10**6}, 1),
    ("gaussian", "sigma 10^6 (sigma2 10^12)", 10**12, {}, 4),
]


def run(draws: int, repeats: int) -> None:
    header = f"{'law':<9} {'parameter':<36} {'draws':>9} {'seconds':>8} {'draws/s':>11} {'words/draw':>10}  arithmetic"
    print(header)
    print("-" * len(header))
    for law, label, param, kwargs, divisor in CASES:
        n = draws // divisor
        sampler = discrete_laplace if law == "laplace" else discrete_gaussian
        best, words, info = float("inf"), 0, None
        for _ in range(repeats):
            rng = CountingSecureRandom()
            start = time.perf_counter()
            x, info = sampler(param, n, rng, return_info=True, **kwargs)
            best = min(best, time.perf_counter() - start)
            words = rng.count
        assert x.dtype == np.int64 and x.size == n
        print(f"{law:<9} {label:<36} {n:>9} {best:>8.3f} {n / best:>11.3g} {words / n:>10.2f}  {info.arithmetic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run(args.draws, args.repeats)


if __name__ == "__main__":
    main()
