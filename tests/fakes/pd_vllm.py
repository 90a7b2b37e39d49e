"""Stands in for a vLLM virtualenv's python under engine kind ``vllm-pd`` (run through a two-line shell wrapper).

* ``-c SCRIPT``: kvbench's version probe gets ``KVBENCH_VERSIONS={"vllm": "0.26.0+fake", ...}``; any other
  script (nothing else runs with ``-c``) exits 1;
* ``-m vllm.entrypoints.openai.api_server ... --port P --kv-transfer-config JSON``: becomes
  :mod:`tests.fakes.pd_engine` on port P, as the prefill side for ``kv_role`` ``kv_producer`` and the decode
  side for ``kv_consumer`` (``$FAKE_PD_KV_BYTES`` bytes per prompt word transferred); a command line
  with another connector than NIXL (alone, or first in a MultiConnector) exits 2, so a side started without it
  fails the test; one with no ``--kv-transfer-config`` (a colocated arm) becomes a plain server (``colocated``);
* anything else (the host-link probe, run by path) exits 1: the link is recorded as not measured.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parent / "pd_engine.py"
PREFILL_S = 0.6
"""The stand-in prefill's time: long enough that a loaded 2-core machine's few ms of scheduling stay within the
breakdown's tolerance (5 % of the TTFT)."""
ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["-c"]:
        if "KVBENCH_VERSIONS=" not in args[1]:
            return 1
        print("KVBENCH_VERSIONS=" + json.dumps({"vllm": "0.26.0+fake", "lmcache": None}))
        return 0
    if args[:2] != ["-m", "vllm.entrypoints.openai.api_server"]:
        return 1
    rendered = flag(args, "--kv-transfer-config")
    if rendered is None and flag(args, "--port") is not None:  # a colocated arm: one plain vLLM
        os.execv(sys.executable, [*engine_argv("colocated", str(flag(args, "--port")))])
    transfer = json.loads(rendered or "{}")
    if transfer.get("kv_connector") == "MultiConnector":  # the P/D connector must come first
        transfer = transfer["kv_connector_extra_config"]["connectors"][0]
    role = ROLES.get(str(transfer.get("kv_role")))
    port = flag(args, "--port")
    if role is None or port is None or not str(transfer.get("kv_connector", "")).startswith("Nixl"):
        print(f"fake vLLM: not a P/D side: {args}", file=sys.stderr)
        return 2
    os.execv(sys.executable, engine_argv(role, port))


def engine_argv(role: str, port: str) -> list[str]:
    argv = [sys.executable, str(ENGINE), "--role", role, "--port", port, "--prefill-s", str(PREFILL_S)]
    argv += ["--transfer-s", "0.05", "--first-token-s", "0.03"]
    return [*argv, "--bytes-per-token", os.environ.get("FAKE_PD_KV_BYTES", "1000")]


if __name__ == "__main__":
    sys.exit(main())
