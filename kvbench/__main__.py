"""Allows ``python -m kvbench``."""

from kvbench.cli import app

app()
