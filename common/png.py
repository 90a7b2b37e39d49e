"""A matplotlib figure written as a small PNG: 256 colours, compressed at PNG's strongest setting.

A line chart holds a few dozen colours plus their anti-aliased edges, so an adaptive 256-colour palette
(octree, no dithering) keeps it visually identical at about a quarter of matplotlib's RGBA file; kept plots in the
repository stay small. The output is a function of the figure alone (no timestamp is written), so the same
figure gives the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image

PALETTE_COLOURS = 256


def save_png(figure: Figure, path: Path, dpi: float) -> None:
    """Render ``figure`` at ``dpi`` and write it to ``path`` as a palette PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    buffer.seek(0)
    with Image.open(buffer) as rendered:
        palette = rendered.convert("RGB").quantize(
            colors=PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
        )
    palette.save(path, format="PNG", optimize=True)


def save_titled_png(figure: Figure, path: Path, title: str, dpi: float) -> None:
    """Put ``title`` over ``figure``, lay it out, write it to ``path`` (:func:`save_png`, its folder made if missing)
    and close it, so a script drawing many figures does not keep them all in pyplot's memory."""
    import matplotlib.pyplot as plt

    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(figure, path, dpi=dpi)
    plt.close(figure)
