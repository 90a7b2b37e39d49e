"""Check the command lines kvbench gives the two vLLM servers of a prefill/decode arm against a vLLM install.

  python3 scripts/gpu/pd_argv.py render SCENARIO | VLLM_PYTHON scripts/gpu/pd_argv.py validate

``render`` (kvbench importable) prints, as one JSON list, every P/D arm's prefill and decode argv after the
launcher (``--model ...``), rendered as engine kind ``vllm-pd`` renders them (placeholder ports; nothing starts).
``validate`` (vLLM importable; needs nothing of kvbench) parses each with vLLM's own OpenAI-server argument
parser, builds its ``KVTransferConfig`` and every MultiConnector child's, and resolves each connector class in
vLLM's connector registry; one ``ok`` line per argv, else a traceback and exit 1. The vLLM-CPU tests run
``validate`` with vLLM 0.32.0; ``scripts/gpu/pd-proof.sh check`` runs both with the GPU machine's vLLM.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def render(scenario_path: str) -> list[list[str]]:
    from harness.engines.configs import VllmPdEngineConfig
    from harness.engines.vllm_pd import preview_side
    from harness.scenario.spec import load_scenario

    scenario, _ = load_scenario(scenario_path)
    config = scenario.engine
    if not isinstance(config, VllmPdEngineConfig):
        raise SystemExit(f"{scenario_path}: engine.kind is {config.kind!r}, not 'vllm-pd'")
    argvs = []
    with tempfile.TemporaryDirectory() as workdir:
        for arm in scenario.arms:
            if arm.name in config.colocated_arms:
                continue
            for role in ("prefill", "decode"):
                argv, _ = preview_side(config, role, arm.profile, Path(workdir))
                argvs.append(list(argv[argv.index("--model") :]))
    return argvs


def validate(argvs: list[list[str]]) -> None:
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.26
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    parser = make_arg_parser(FlexibleArgumentParser())
    fields = set(KVTransferConfig.__dataclass_fields__)
    for argv in argvs:
        engine = EngineArgs.from_cli_args(parser.parse_args(argv))
        transfer = engine.kv_transfer_config
        if not isinstance(transfer, KVTransferConfig):
            transfer = KVTransferConfig(**transfer)
        children = transfer.kv_connector_extra_config.get("connectors") or [
            {"kv_connector": transfer.kv_connector, "kv_role": transfer.kv_role}
        ]
        for child in children:
            KVConnectorFactory.get_connector_class(KVTransferConfig(**{k: v for k, v in child.items() if k in fields}))
        names = [child.get("kv_connector") for child in children]
        print("ok", transfer.kv_connector, transfer.kv_role, names)


def main() -> int:
    if sys.argv[1:2] == ["render"] and len(sys.argv) == 3:
        print(json.dumps(render(sys.argv[2])))
        return 0
    if sys.argv[1:] == ["validate"]:
        validate(json.loads(sys.stdin.read()))
        return 0
    print("usage: pd_argv.py render SCENARIO | pd_argv.py validate", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
