"""An attached endpoint without ``POST /tokenize``: prompts are built with a local tokenizer, and the run says which.

* kvbench's :class:`~workloads.tokenizer.WordTokenizer`: exactly reversible, prefix-stable (what
  :func:`workloads.text.fit_to_tokens` needs), one token per word, and never passes its ids off as the engine's;
* ``engine.vocab`` (``--tokenizer DIR``): the given ``tokenizer.json`` builds the prompts;
* the choice is made once at attach time and named in the engine facts (the manifest).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from common.errors import KvbenchError
from harness.engines.base import LaunchContext
from harness.engines.configs import OpenAIEngineConfig
from harness.engines.openai import OpenAIEngine
from offload.profiles import resolve_profile
from tests.fakes.plain_openai import plain_openai
from workloads.text import fit_to_tokens
from workloads.tokenizer import WordTokenizer, tokenizer_facts


def test_word_tokenizer_round_trips_and_fits_prompts_exactly() -> None:
    tokenizer = WordTokenizer()
    text = "Document 0-8000-1. Hello, world!\n\n  Q: what is 42?\tA: ünïcode 🙂 words"
    ids = tokenizer.encode_sync(text)
    assert asyncio.run(tokenizer.decode(ids)) == text
    assert len(tokenizer.encode_sync(" model cache")) == 2  # a word with its leading space is one token
    for cut in range(len(ids)):  # every prefix of the ids decodes to text that encodes back to that prefix
        assert tokenizer.encode_sync(asyncio.run(tokenizer.decode(ids[:cut]))) == ids[:cut]
    prompt = asyncio.run(fit_to_tokens(tokenizer, "Header. ", random.Random(3), 777))
    assert len(tokenizer.encode_sync(prompt)) == 777
    assert tokenizer_facts(tokenizer) == (WordTokenizer.description, False)
    with pytest.raises(KvbenchError, match="token_ids needs the engine's own token ids"):
        asyncio.run(tokenizer.prompt_ids("hello"))
    with pytest.raises(ValueError, match="not made by this tokenizer"):
        asyncio.run(tokenizer.decode([-1]))


def write_tokenizer_json(directory: Path) -> Path:
    """A small word-level tokenizer.json made with the ``tokenizers`` package (as a model directory holds)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(["hello", "world", "kv", "bench"])}}
    made = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir()
    made.save(str(directory / "tokenizer.json"))
    return directory


def attach(base_url: str, tmp_path: Path, vocab: str | None) -> tuple[dict[str, str], int, bool]:
    """Attach to ``base_url``: (its engine facts' details, the token count of a probe text, whether it is exact)."""
    config = OpenAIEngineConfig(kind="openai", model="plain-model", base_url=base_url, vocab=vocab)
    context = LaunchContext(arm="A", profile=resolve_profile("hbm"), log_dir=tmp_path, prefix_caching=True)

    async def go() -> tuple[dict[str, str], int, bool]:
        async with OpenAIEngine(config, context) as running:
            tokenizer = running.tokenizer()
            count = len(await tokenizer.encode("hello world kv bench, hello"))
            return dict(running.facts.details), count, tokenizer_facts(tokenizer)[1]

    return asyncio.run(go())


def test_a_server_without_tokenize_gets_the_given_tokenizer_or_kvbench_own(tmp_path: Path) -> None:
    model_dir = write_tokenizer_json(tmp_path / "model")
    with plain_openai() as server:
        given, given_count, given_exact = attach(server.base_url, tmp_path, str(model_dir))
        own, own_count, own_exact = attach(server.base_url, tmp_path, None)
        asked = server.paths.count("POST /tokenize")
    assert asked == 2  # once per attach, not per prompt
    assert given["prompts_built_with"].startswith(f"tokenizer.json at {model_dir / 'tokenizer.json'}")
    assert "no POST /tokenize (HTTP 404)" in given["prompts_built_with"] and given["counts_exact"] == "false"
    assert given_count == 6  # WordLevel + Whitespace: hello world kv bench , hello
    assert own["prompts_built_with"].startswith("kvbench's word tokenizer") and own["counts_exact"] == "false"
    assert own_count == 6  # hello / world / kv / bench / "," / hello
    assert not given_exact and not own_exact
    with plain_openai() as server, pytest.raises(KvbenchError, match=r"no tokenizer\.json there"):
        attach(server.base_url, tmp_path, str(tmp_path))
