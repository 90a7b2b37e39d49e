"""Bundled scenario files (YAML), found by name: ``kvbench run quickstart``."""

from pathlib import Path

BUNDLED = Path(__file__).resolve().parent
"""The folder that holds the bundled scenario files, wherever kvbench is installed."""
