"""The simulator tokenizer: exact round trip, stable ids across processes, ~1 token per word."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Mapping

import pytest

from harness.sim.tokenizer import (
    CHAR_BASE,
    SUBWORD_BASE,
    VOCAB_SIZE,
    WORDS,
    SimTokenizer,
    apply_chat_template,
    decode,
    encode,
    encode_by_pieces,
    token_text,
)
from workloads.tokenizer import Tokenizer

SAMPLES = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces, trailing tab\t",
    "line one\nline two\r\n\n\nCRLF and blank lines",
    "Zorblax HTTPServer camelCase snake_case kebab-case x86_64",
    "digits 1234567890 and 3.14159, -42, 1e-9",
    "ünïcødé, 日本語のテキスト, emoji 🎉🚀, combining e\u0301",
    "lone surrogate \ud800 and NUL \x00 survive",
    "<|start|>user\nhi<|end|>\n <|start|> <|end|> <|unknown|>",
    "punctuation !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ all of it",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_exact(text: str) -> None:
    ids = encode(text)
    assert decode(ids) == text
    assert "".join(token_text(i) for i in ids) == text
    assert all(0 <= i < VOCAB_SIZE for i in ids)


def test_round_trip_random_unicode_and_fast_path_matches_definition() -> None:
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0, 0x3000, 7)] + list("  \n\tabcXYZ,.<|>start end") * 20
    for _ in range(1000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        ids = encode(text)
        assert ids == encode_by_pieces(text)
        assert decode(ids) == text


def test_every_subword_id_decodes_and_reencodes() -> None:
    for token_id in range(SUBWORD_BASE, CHAR_BASE, 37):
        text = token_text(token_id)
        assert decode(encode(text)) == text
    with pytest.raises(ValueError, match="not in the simulator vocabulary"):
        token_text(VOCAB_SIZE)


def test_vocabulary_words_are_single_tokens_in_all_forms() -> None:
    assert len(set(WORDS)) == len(WORDS)
    assert all(word.isascii() and word.isalpha() and word.islower() for word in WORDS)
    for word in WORDS[:50]:
        for form in (word, " " + word, word.capitalize(), " " + word.capitalize()):
            assert len(encode(form)) == 1, form


def test_about_one_token_per_english_word() -> None:
    rng = random.Random(3)
    common = " ".join(rng.choice(WORDS) for _ in range(2000)) + "."
    assert len(encode(common)) == 2001
    rare = "Photosynthesis transforms luminous energy into chemical bonds within chloroplasts."
    words = len(rare.split())
    assert words <= len(encode(rare)) <= 4 * words


def test_ids_are_identical_in_another_process() -> None:
    text = " ".join(SAMPLES[1:8])
    script = "import json, sys; from harness.sim.tokenizer import encode; print(json.dumps(encode(sys.stdin.read())))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", script], input=text, capture_output=True, text=True, env=env, check=True, timeout=60
    )
    assert json.loads(done.stdout) == encode(text)


def test_chat_template() -> None:
    messages: list[Mapping[str, object]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    text = apply_chat_template(messages)
    assert text == "<|start|>system\nBe brief.<|end|>\n<|start|>user\nHi<|end|>\n<|start|>assistant\n"
    assert apply_chat_template(messages, add_generation_prompt=False).endswith("Hi<|end|>\n")
    ids = SimTokenizer().chat_ids(messages)
    assert ids[0] == encode("<|start|>")[0] and len(encode("<|start|>")) == 1
    with pytest.raises(ValueError, match="role"):
        apply_chat_template([{"content": "x"}])
    with pytest.raises(ValueError, match="text content parts"):
        apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])


async def test_async_protocol() -> None:
    tokenizer: Tokenizer = SimTokenizer()
    ids = await tokenizer.encode("Async works, too.")
    assert await tokenizer.decode(ids) == "Async works, too."
