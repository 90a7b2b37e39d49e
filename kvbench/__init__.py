"""kvbench: benchmark and proof-of-concept harness for KV-cache offloading in LLM inference.

This package is the command line (``kvbench.cli``), the top floor: nothing imports it. The pipeline's
stages are the repository's other top-level packages: ``common`` (the ground floor), ``harness``
(scenario, engines, sim, client, runs, store, results, gate), ``workloads``, ``offload``, ``reports``
and ``scenarios`` (bundled YAML files). See docs/architecture.md.
"""

from common import __version__

__all__ = ["__version__"]
