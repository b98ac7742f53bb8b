"""The release figures' own pieces (the figures themselves are drawn by the CLI and docs tests)."""

from __future__ import annotations

import numpy as np

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
