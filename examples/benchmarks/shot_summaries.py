"""Screenshots of every shipped spec's summary.html in headless Chromium (a real browser).

Runs each spec in models/ once (seeded, NOT private: this is a check of the report, not a
release), renders its ``summary.html`` in headless Chromium and writes one PNG per algorithm,
so that a person can look at what a statistician sees. Data files come from ../shared/data;
a spec whose data is absent is skipped with the reason.

    OPENBLAS_NUM_THREADS=1 python examples/benchmarks/shot_summaries.py [--out DIR] [--only NAME ...]

Needs Debian's chromium (``apt-get install chromium``; /usr/bin/chromium). Prints, per spec,
the algorithm, the run's wall time, the summary's sections and the screenshot's path.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
DATA_FILES = {"adult_matrix_mechanism": "adult.csv", "czech": "czech.csv", "czech_barak": "czech.csv",
              "kdd99_dualquery": "kdd99_dq.csv.gz", "nltcs_mwem": "nltcs.csv", "nltcs_polynomial": "nltcs.csv",
              "rochdale": "rochdale.csv"}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("shot_summaries: no Chromium found (apt-get install chromium)")


def screenshot(browser: str, html: Path, png: Path, height: int = 16000) -> None:
    """A tall window, then the white space below the page's end cut off (matplotlib reads PNG)."""
    import matplotlib.image as mpimg

    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                        f"--window-size=1280,{height}", html.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    image = mpimg.imread(png)
    inked = (image[..., :3] < 0.98).any(axis=(1, 2))
    last = int(inked.nonzero()[0].max()) + 40 if inked.any() else image.shape[0]
    mpimg.imsave(png, image[:min(last, image.shape[0])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("summary_shots"))
    ap.add_argument("--only", nargs="*", help="spec names (default: every spec in models/)")
    args = ap.parse_args()
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    specs = sorted((ROOT / "models").glob("*.toml"))
    for spec in specs:
        name = spec.stem
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, "-m", "dpopt.cli", "run", str(spec), "--seed", "1", "--overwrite",
               "--out", str(args.out / name)]
        if name in DATA_FILES:
            path = DATA / DATA_FILES[name]
            if not path.is_file():
                print(f"{name}: skipped ({path} is absent)")
                continue
            cmd += ["--data", str(path)]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{name}: run failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        html = args.out / name / "summary.html"
        if not html.is_file():  # the spec writes only Markdown: render the same report as HTML
            from dpopt.report import render_html

            html = args.out / f"{name}.html"  # beside the release: dpopt replaces only what it wrote
            page = render_html(json.loads((args.out / name / "report.json").read_text()))
            html.write_text(page.replace('src="plots/', f'src="{name}/plots/'), encoding="utf-8")
        text = html.read_text(encoding="utf-8")
        sections = re.findall(r"<h2>(.*?)</h2>", text)
        algorithm = json.loads((args.out / name / "report.json").read_text())["algorithm"]["name"]
        png = args.out / f"{name}.png"
        screenshot(browser, html, png)
        print(f"{name}: algorithm {algorithm}, run {wall:.1f} s; "
              f"sections: {', '.join(sections)}; screenshot {png}")


if __name__ == "__main__":
    main()
