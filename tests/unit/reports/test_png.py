"""The what-if plots' PNG writer (common/png.py): small, the same picture, the same bytes for the same figure."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from common.png import save_png


def chart() -> Figure:
    figure, axis = plt.subplots(figsize=(6, 4))
    x = np.linspace(1, 50, 60)
    for scale, style in ((1.0, "o-"), (2.0, "s--"), (4.0, "^:")):
        axis.plot(x, scale * 1000 / x, style, label=f"x{scale:g}")
    axis.set_xscale("log")
    axis.legend()
    axis.grid(True, alpha=0.3)
    return figure


def test_the_palette_png_is_the_same_picture_smaller_and_reproducible(tmp_path: Path) -> None:
    figure = chart()
    plain = io.BytesIO()
    figure.savefig(plain, format="png", dpi=110)
    save_png(figure, tmp_path / "a.png", dpi=110)
    save_png(figure, tmp_path / "b.png", dpi=110)
    plt.close(figure)

    small = (tmp_path / "a.png").read_bytes()
    assert small == (tmp_path / "b.png").read_bytes()
    assert len(small) < len(plain.getvalue()) / 2
    with Image.open(tmp_path / "a.png") as written, Image.open(io.BytesIO(plain.getvalue())) as rendered:
        assert written.mode == "P" and written.size == rendered.size
        difference = np.abs(
            np.asarray(written.convert("RGB"), dtype=np.int16) - np.asarray(rendered.convert("RGB"), dtype=np.int16)
        )
    assert np.percentile(difference, 99) <= 8  # anti-aliased edges may move by a few levels, the chart does not
