"""kvbench: benchmark and proof-of-concept harness for KV-cache offloading in LLM inference.

This package is the ground floor (``errors``, ``redact``, ``schema``) and the command line
(``kvbench.cli``). The pipeline's stages are the repository's top-level packages, imported by
their folder names: ``harness`` (scenario, engines, sim, client, runs, store, results, gate),
``workloads``, ``offload``, ``reports`` and ``scenarios`` (bundled YAML files). See
docs/architecture.md.
"""

__version__ = "0.1.0"
