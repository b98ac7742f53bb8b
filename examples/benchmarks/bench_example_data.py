import time
from dpopt.datasets.census import generate_census
for n in [10**3, 10**5, 10**6, 10**7]:
    ts = []
    for rep in range(3 if n < 10**7 else 2):
        t = time.perf_counter(); df = generate_census(n, seed=rep); ts.append(time.perf_counter() - t)
        assert len(df) == n
    print(f"{n:>10,d} rows: best {min(ts):.3f} s  (runs: {', '.join(f'{x:.3f}' for x in ts)})")
