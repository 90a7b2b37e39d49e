"""Bundled scenario files (YAML), found by name: ``kvbench run quickstart``."""
