"""kvbench: benchmark and proof-of-concept harness for KV-cache offloading in LLM inference.

The installed package maps the repository's top-level folders into one namespace:
``kvbench.harness`` (scenario, engines, client, runner), ``kvbench.workloads``,
``kvbench.offload``, ``kvbench.reports`` and ``kvbench.scenarios`` (bundled YAML files).
"""

__version__ = "0.1.0"
