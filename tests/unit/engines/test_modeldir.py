"""Hub-free model directories: shapes, the locally trained tokenizer, determinism, the CLI."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.engines.modeldir import (
    CHAT_TEMPLATE,
    CONFIG_TRANSFORMERS_VERSION,
    FILLER_PREFIX,
    SPECIAL_TOKENS,
    TOKENIZER_VOCAB_SIZE,
    build_tokenizer_json,
    pad_tokenizer_json,
    shape_config,
    shape_names,
    synthesize_model_dir,
)
from kvbench.cli.model import model_app

tokenizers = pytest.importorskip("tokenizers")

FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "kvbench-model.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny")


def digests(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (
            "llama-3.1-8b",
            {
                "architectures": ["LlamaForCausalLM"],
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "rope_theta": 500000.0,
                "max_position_embeddings": 131072,
                "rms_norm_eps": 1e-05,
            },
        ),
        (
            "llama-3.1-70b",
            {
                "num_hidden_layers": 80,
                "hidden_size": 8192,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 28672,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
            },
        ),
        (
            "qwen3-14b",
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "num_hidden_layers": 40,
                "hidden_size": 5120,
                "num_attention_heads": 40,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 17408,
                "vocab_size": 151936,
                "rope_theta": 1000000,
                "rope_scaling": None,
                "max_position_embeddings": 40960,
                "rms_norm_eps": 1e-06,
            },
        ),
        (
            "qwen3-14b-128k",
            {
                "hidden_size": 5120,
                "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
        ),
        ("tiny", {"num_hidden_layers": 4, "hidden_size": 256, "head_dim": 64, "vocab_size": TOKENIZER_VOCAB_SIZE}),
    ],
)
def test_shapes_match_public_configs(shape: str, expected: dict[str, object]) -> None:
    config = shape_config(shape)
    for key, value in expected.items():
        assert config[key] == value, key
    if shape.startswith("llama-3.1"):
        assert config["rope_scaling"] == {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        }
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"]


def test_unknown_shape() -> None:
    with pytest.raises(ValueError, match=r"known shapes: .*llama-3\.1-8b"):
        shape_config("gpt-5")
    assert "tiny" in shape_names()


def test_tiny_directory(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert 1000 < tokenizer.get_vocab_size() <= config["vocab_size"]
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    assert None not in ids.values()
    assert config["bos_token_id"] == ids["<|begin_of_text|>"]
    assert config["eos_token_id"] == [ids["<|end_of_text|>"], ids["<|eot_id|>"]]
    generation = json.loads((tiny / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]
    tokenizer_config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tokenizer_config["bos_token"] == "<|begin_of_text|>" and tokenizer_config["eos_token"] == "<|eot_id|>"
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer_config["model_max_length"] == 131072
    # without it transformers 5.x logs a false "incorrect regex pattern" warning at every engine start
    assert config["transformers_version"] == CONFIG_TRANSFORMERS_VERSION


def test_tokenizer_round_trips_and_adds_bos(tiny: Path) -> None:
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny / "tokenizer.json"))
    text = "The cache keeps 12,345 tokens; résumé — naïve café? {json: true}\n\tTabs too."
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == tokenizer.token_to_id("<|begin_of_text|>")
    assert tokenizer.decode(encoding.ids) == text  # byte-level: nothing is lost
    plain = tokenizer.encode(text, add_special_tokens=False).ids
    assert plain == encoding.ids[1:]
    common = "the people of the world work in the house and the school"
    assert len(tokenizer.encode(common, add_special_tokens=False).ids) <= 1.5 * len(common.split())


def test_chat_template_renders_llama3_headers(tiny: Path) -> None:
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    text = template.render(
        bos_token="<|begin_of_text|>",
        messages=[
            {"role": "system", "content": "Be brief. "},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
        add_generation_prompt=True,
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny / "tokenizer.json"))
    tokens = tokenizer.encode(text, add_special_tokens=False).tokens
    assert tokens.count("<|start_header_id|>") == 3 and tokens.count("<|eot_id|>") == 2


def test_output_is_deterministic(tiny: Path, tmp_path: Path) -> None:
    again = synthesize_model_dir("tiny", tmp_path / "again")
    assert digests(again) == digests(tiny)


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        synthesize_model_dir("tiny", tmp_path)
    synthesize_model_dir("llama-3.1-8b", tmp_path, overwrite=True)
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 32
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.parent.iterdir() if p.name.startswith(".kvbench-model-")) == []


def test_cli_synth(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(model_app, ["synth", "--shape", "qwen3-14b", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    assert "qwen3-14b" in result.output
    assert json.loads((tmp_path / "q" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    again = runner.invoke(model_app, ["synth", "--shape", "qwen3-14b", str(tmp_path / "q")])
    assert again.exit_code == 1 and "not empty" in again.output
    unknown = runner.invoke(model_app, ["synth", "--shape", "nope", str(tmp_path / "n")])
    assert unknown.exit_code == 2 and "known shapes" in unknown.output
    listing = runner.invoke(model_app, ["shapes"])
    assert listing.exit_code == 0 and "llama-3.1-70b" in listing.output


# ---------------------------------------------------------------- every id the engine can emit shows text


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_model_dir("llama-3.1-8b", tmp_path_factory.mktemp("models") / "llama")


def special_ids(tokenizer: Any) -> set[int]:
    return {tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def lone_high_byte_ids(tokenizer: Any) -> set[int]:
    """Single-byte entries 0x80-0xFF: not valid UTF-8 on their own."""
    return {
        index
        for token, index in tokenizer.get_vocab().items()
        if len(token) == 1 and tokenizer.decode([index]) == "\ufffd"
    }


def test_tokenizer_covers_config_vocab(tiny: Path, llama: Path) -> None:
    for directory in (tiny, llama):
        config = json.loads((directory / "config.json").read_text())
        tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        assert tokenizer.get_vocab_size() == config["vocab_size"]
        assert sorted(tokenizer.get_vocab().values()) == list(range(config["vocab_size"]))
        meta = json.loads((directory / "kvbench-model.json").read_text())
        assert meta["tokenizer_vocab_size"] == config["vocab_size"]
        assert meta["trained_vocab_size"] <= min(TOKENIZER_VOCAB_SIZE, config["vocab_size"])


def test_tiny_decodes_every_id_to_text(tiny: Path) -> None:
    """Every id of the tiny shape decodes to non-empty text; specials only when not skipped."""
    config = json.loads((tiny / "config.json").read_text())
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny / "tokenizer.json"))
    specials = special_ids(tokenizer)
    for index in range(config["vocab_size"]):
        assert tokenizer.decode([index], skip_special_tokens=False), index
        if index not in specials:
            assert tokenizer.decode([index], skip_special_tokens=True), index


def test_streaming_detokenizer_shows_every_id_but_specials_and_lone_bytes(tiny: Path) -> None:
    """What a server streams per token (vLLM uses DecodeStream): text at once for every other id."""
    decoders = pytest.importorskip("tokenizers.decoders")
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny / "tokenizer.json"))
    held = set()
    for index in range(tokenizer.get_vocab_size()):
        stream = decoders.DecodeStream(skip_special_tokens=True)
        if not stream.step(tokenizer, index):
            held.add(index)
    assert held == special_ids(tokenizer) | lone_high_byte_ids(tokenizer)
    assert len(held - special_ids(tokenizer)) == 0x100 - 0x80


def test_llama_sampled_ids_decode_to_text(llama: Path) -> None:
    config = json.loads((llama / "config.json").read_text())
    tokenizer = tokenizers.Tokenizer.from_file(str(llama / "tokenizer.json"))
    trained = json.loads((llama / "kvbench-model.json").read_text())["trained_vocab_size"]
    rng = random.Random(config["vocab_size"])
    fillers = range(trained, config["vocab_size"])
    sample = {trained, config["vocab_size"] - 1, *rng.sample(fillers, TOKENIZER_VOCAB_SIZE)}
    decoders = pytest.importorskip("tokenizers.decoders")
    for index in sorted(sample):
        text = tokenizer.decode([index])
        assert text.startswith(FILLER_PREFIX) and text.isprintable() and not any(c.isspace() for c in text), index
        assert decoders.DecodeStream(skip_special_tokens=True).step(tokenizer, index) == text
    assert len({tokenizer.decode([index]) for index in sample}) == len(sample)  # distinct
    assert config["bos_token_id"] == tokenizer.token_to_id("<|begin_of_text|>")
    assert config["eos_token_id"] == [tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot_id|>")]


def test_padding_keeps_encoding_and_is_deterministic() -> None:
    trained_json = build_tokenizer_json()
    trained = tokenizers.Tokenizer.from_str(trained_json)
    extra = len(trained.get_vocab()) // 2
    padded_json = pad_tokenizer_json(trained_json, trained.get_vocab_size() + extra)
    assert padded_json == pad_tokenizer_json(trained_json, trained.get_vocab_size() + extra)
    padded = tokenizers.Tokenizer.from_str(padded_json)
    assert padded.get_vocab_size() == trained.get_vocab_size() + extra
    text = "The cache keeps 12,345 tokens; résumé — naïve café? ~tilde~ {json: true}\n\tTabs too."
    assert padded.encode(text).ids == trained.encode(text).ids
    assert padded.decode(padded.encode(text).ids) == text
    with pytest.raises(ValueError, match="exceeds vocab_size"):
        pad_tokenizer_json(trained_json, trained.get_vocab_size() - 1)
