"""Token-id prompts (``prompt: token_ids``): the ids the engine itself makes of a completion prompt, BOS included,
so that sending them skips only the engine's tokenizing."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from common.errors import ScenarioError
from harness.engines.common import ModelDirTokenizer, ServerTokenizer, open_session
from harness.engines.modeldir import synthesize_model_dir
from harness.scenario.spec import parse_scenario
from harness.sim.tokenizer import SimTokenizer

pytest.importorskip("tokenizers")

TEXT = "Document 0-2000-0. The quick brown fox\n\nQ: Question 1: why?\nA:"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny")


async def test_a_model_directory_adds_the_bos_the_engine_adds(tiny: Path) -> None:
    tokenizer = ModelDirTokenizer.from_model_dir(tiny, "test")
    bos = json.loads((tiny / "config.json").read_text())["bos_token_id"]
    assert await tokenizer.prompt_ids(TEXT) == [bos, *await tokenizer.encode(TEXT)]


async def test_a_server_is_asked_for_its_special_tokens_and_a_server_without_tokenize_falls_back(tiny: Path) -> None:
    asked: list[bool] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body["add_special_tokens"])
        return web.json_response({"tokens": [0, 7, 8] if body["add_special_tokens"] else [7, 8]})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    local = ModelDirTokenizer.from_model_dir(tiny, "test")
    async with TestServer(app, host="127.0.0.1") as server, contextlib.AsyncExitStack() as stack:
        base_url = str(server.make_url("")).rstrip("/")
        tokenizer = ServerTokenizer(open_session(stack), base_url, "m")
        assert await tokenizer.encode("a b") == [7, 8]
        assert await tokenizer.prompt_ids("a b") == [0, 7, 8]
        # no /tokenize on this path: the fallback tokenizer makes the ids, its BOS included
        elsewhere = ServerTokenizer(open_session(stack), base_url + "/none", "m", fallback=lambda path, status: local)
        assert await elsewhere.prompt_ids(TEXT) == await local.prompt_ids(TEXT)
        assert not elsewhere.uses_endpoint
    assert asked == [False, True]


async def test_the_simulator_adds_no_special_token_to_a_text_prompt() -> None:
    assert await SimTokenizer().prompt_ids(TEXT) == await SimTokenizer().encode(TEXT)


def test_token_ids_need_the_completions_api() -> None:
    data = {
        "name": "ids",
        "engine": {"kind": "sim", "model": "llama-3.1-8b", "hardware": "h100-sxm"},
        "arms": [{"name": "OFF", "offload": "off"}],
        "workload": {"kind": "multi_round_qa", "context_tokens": [1000], "prompt": "token_ids"},
    }
    with pytest.raises(ScenarioError, match=r"prompt: token_ids needs api: completions .*got api: chat") as error:
        parse_scenario(data, "ids.yaml")
    assert str(error.value).startswith("ids.yaml: invalid scenario")
    assert "allowed: prompt: text with either api, prompt: token_ids with api: completions" in str(error.value)
    data["workload"]["api"] = "completions"  # type: ignore[index]
    assert parse_scenario(data, "ids.yaml").probe_workload.prompt == "token_ids"
