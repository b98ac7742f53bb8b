"""The release figures' own pieces (the figures themselves are drawn by the CLI and docs tests)."""

from __future__ import annotations

import numpy as np
import pytest

from dpopt.plots import decade_label, scatter_released


def test_decade_labels_are_plain_text_powers_of_ten():
    assert [decade_label(v) for v in (0, 1, 10, 100, 1e3, 1e6, -10, -1e4)] == \
        ["0", "1", "10", "10²", "10³", "10⁶", "−10", "−10⁴"]
    assert decade_label(20) == "" and decade_label(-5) == ""  # off the decades: no label (as by default)


def test_scatter_draws_without_mathtext(tmp_path):
    """The symmetric-log axes are labelled without mathtext, whose parser costs 0.1-0.3 CPU-s (#30)."""
    import matplotlib.mathtext as mathtext

    calls = []
    original = mathtext.MathTextParser.parse
    mathtext.MathTextParser.parse = lambda self, *a, **k: calls.append(a) or original(self, *a, **k)
    try:
        rng = np.random.default_rng(0)
        ref = rng.normal(0, 300, 200)
        path = scatter_released([("q", ref, ref + rng.normal(0, 3, 200))], tmp_path / "s.png",
                                reference_name="noisy", title="t")
    finally:
        mathtext.MathTextParser.parse = original
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert calls == []


# ---- the figures' child process (issue #30) ------------------------------------------------------
def _figures():
    """Inputs of two figures (a scatter and bars), as :func:`dpopt.plots.plot_inputs` gives them."""
    rng = np.random.default_rng(1)
    ref = rng.normal(0, 300, 50)
    return [("released_vs_noisy", "scatter", "s.png", dict(series=[("q", ref, ref + rng.normal(0, 3, 50))],
                                                             reference_name="noisy", title="t")),
            ("change_by_query", "bars", "b.png", dict(labels=["q", "r"], values={"RMS change": [0.5, 1.5]},
                                                       ylabel="y", title="t"))]


def _needs_fork():
    from dpopt.release.plot_worker import AVAILABLE

    if not AVAILABLE:
        pytest.skip("the figures' child process needs fork (Linux)")


def test_the_child_draws_the_same_files_as_the_parent(tmp_path):
    from dpopt.plots import draw_plots
    from dpopt.release.plot_worker import PlotWorker

    _needs_fork()
    here = draw_plots(_figures(), tmp_path / "parent")
    worker = PlotWorker.start()
    try:
        worker.submit(_figures(), tmp_path / "child")
        there = worker.result()
    finally:
        worker.close()
    assert here == there == {"released_vs_noisy": "s.png", "change_by_query": "b.png"}
    for file in here.values():
        assert (tmp_path / "child" / file).read_bytes() == (tmp_path / "parent" / file).read_bytes()


def test_a_dead_child_leaves_the_figures_to_the_parent(tmp_path):
    import os
    import signal

    from dpopt.release.plot_worker import PlotWorker

    _needs_fork()
    worker = PlotWorker.start()
    os.kill(worker.pid, signal.SIGKILL)
    try:
        worker.submit(_figures(), tmp_path)
        assert worker.result() == {"released_vs_noisy": "s.png", "change_by_query": "b.png"}
    finally:
        worker.close()
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and worker.pid == 0


@pytest.mark.parametrize("stage", ["reading the data", "writing the tables"])
def test_a_run_that_fails_kills_and_reaps_the_child_and_leaves_nothing(tmp_path, monkeypatch, stage):
    """A release that fails after the plan, before the figures are asked for or while the child
    draws them, leaves no child process and no file behind: the child is killed before the
    temporary directory it draws into is removed."""
    import os

    import dpopt.release.outputs as outputs
    import dpopt.release.pipeline as pipeline
    from dpopt.release.plot_worker import PlotWorker

    _needs_fork()
    started = []
    original = PlotWorker.start

    def start():
        worker = original()
        started.append(worker.pid)
        return worker

    def fail(*args, **kwargs):
        raise OSError(f"failed at {stage}")

    monkeypatch.setattr(PlotWorker, "start", staticmethod(start))
    if stage == "reading the data":
        monkeypatch.setattr(pipeline, "load_data", fail)
    else:
        monkeypatch.setattr(outputs, "_write_csv", fail)
    with pytest.raises(OSError, match=stage), pytest.warns(pipeline.NotPrivateWarning):
        pipeline.run("quickstart", seed=1, out=tmp_path / "out", plot_process=True)
    assert len(started) == 1 and list(tmp_path.iterdir()) == []
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(started[0], os.WNOHANG)


def test_a_release_with_plots_leaves_matplotlib_to_the_child(tmp_path):
    """With ``plot_process`` (what ``dpopt run`` asks) the release process itself never imports
    matplotlib on Linux: the child draws (the same files)."""
    import subprocess
    import sys

    _needs_fork()
    code = ("import sys, warnings; warnings.simplefilter('ignore'); from dpopt.release import run; "
            f"r = run('quickstart', seed=1, out={str(tmp_path / 'out')!r}, plot_process=True); "
            "print('matplotlib' in sys.modules, sorted(r.report['plots']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "['accuracy_by_query',", "'change_by_query',", "'released_vs_noisy']"]
    assert all((tmp_path / "out" / "plots" / f"{n}.png").is_file()
               for n in ("accuracy_by_query", "change_by_query", "released_vs_noisy"))
