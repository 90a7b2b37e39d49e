"""Hub-free model directories: a model's ``config.json`` plus a tokenizer built here.

Real engines started with ``--load-format dummy`` need only a model directory holding the
architecture (``config.json``) and a tokenizer: the weights are random, the kernels and therefore
the timings are real. Nothing can be downloaded on the benchmark machines, so
:func:`synthesize_model_dir` writes such a directory from a named shape:

* ``llama-3.1-8b``, ``llama-3.1-70b``, ``qwen3-14b``: the architecture fields of the public
  ``config.json`` files (layers, hidden size, heads, KV heads, head_dim, intermediate size, vocab
  size, RoPE theta and scaling, max positions). ``qwen3-14b-128k`` is Qwen3-14B with the YaRN
  rope scaling (factor 4 over 32768) that Qwen documents for 131072-token contexts.
* ``tiny``: a 4-layer Llama (hidden 256) for CPU engines and tests.

The tokenizer is a byte-level BPE trained locally, with the ``tokenizers`` package, on English
text generated from a fixed word list and a fixed seed. Its vocabulary (8192 entries at most) is
smaller than every shape's ``vocab_size``; ids it does not know decode to nothing, which random
weights produce harmlessly. Special tokens and the chat template follow Llama 3's layout
(``<|begin_of_text|>``, ``<|start_header_id|>role<|end_header_id|>``, ``<|eot_id|>``), and
``bos_token_id``/``eos_token_id`` in ``config.json`` point at this tokenizer's ids. The output is
byte-for-byte deterministic.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
BOS_TOKEN, END_OF_TEXT_TOKEN, _, _, EOT_TOKEN = SPECIAL_TOKENS
TOKENIZER_VOCAB_SIZE = 8192
"""Upper bound of the trained tokenizer's vocabulary (special tokens included)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
"""Llama-3-style chat template: one header block per message, ``<|eot_id|>`` after each."""

_LLAMA31_ROPE_SCALING: dict[str, Any] = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def _llama(*, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "head_dim": hidden // heads,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": dict(_LLAMA31_ROPE_SCALING),
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
    }


def _qwen3_14b(*, yarn_128k: bool) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 17408,
        "max_position_embeddings": 40960,
        "max_window_layers": 40,
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
    if yarn_128k:
        config["max_position_embeddings"] = 131072
        config["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        }
    return config


SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _llama(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "llama-3.1-70b": _llama(layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=128256),
    "qwen3-14b": _qwen3_14b(yarn_128k=False),
    "qwen3-14b-128k": _qwen3_14b(yarn_128k=True),
    "tiny": _llama(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=TOKENIZER_VOCAB_SIZE),
}
"""Shape name -> config.json architecture fields (bos/eos ids are added per tokenizer)."""


def shape_names() -> list[str]:
    return sorted(SHAPES)


def shape_config(shape: str) -> dict[str, Any]:
    """The architecture fields of one shape (a copy); ValueError naming the known shapes."""
    try:
        return json.loads(json.dumps(SHAPES[shape]))  # type: ignore[no-any-return]
    except KeyError:
        raise ValueError(f"unknown model shape {shape!r}; known shapes: {', '.join(shape_names())}") from None


# ---------------------------------------------------------------------------------------------
# tokenizer

_WORDS = """
the of and to in a is that for it as was with be by on not he this are or his from at which
but have an they you were her she there been one all we their has would when if so no will more
about can said out up them some could what into time only new its other than then two first like
also these any may after over people year years way work world back our most many day state well
because even through much before where made life should between each those house city great own
school under long part while place right man country water same being number found system never
again against because high small large every old group during without public since still government
information market research problem question hand local around change point program business service
health development order light morning evening night music story river mountain forest garden window
table chapter letter paper report study model engine cache memory storage network server request
token context answer reason history science nature family friend mother father child teacher doctor
student village island ocean summer winter spring autumn weather journey language computer machine
simple quick quiet bright dark early late happy careful strong gentle ancient modern common special
important possible different available certain clear whole free full real best better little young
open close begin follow become remain carry write read speak listen learn teach build grow move turn
travel remember consider continue explain describe understand discover measure compare improve
quickly slowly carefully often always sometimes usually perhaps together already almost enough
""".split()

_CONNECTORS = ("and", "but", "so", "because", "while", "although", "when", "after", "before", "since")

# English-like morphemes: words built from them teach the BPE the sub-word pieces of words that
# are not in _WORDS (so arbitrary English text costs ~1.3-1.6 tokens per word, not 3-4).
_PREFIXES = "re un in dis pre con com pro ex de en im inter over sub trans under".split()
_ONSETS = "b c d f g h j k l m n p r s t v w y z bl br ch cl cr dr fl fr gr pl pr sh sl sp st str th tr wh".split()
_NUCLEI = "a e i o u ai ea ee ie oa oo ou ar er ir or ur al el il ol an en in on".split()
_CODAS = "b ck d ft g l ld ll m mp n nd ng nk nt p r rd rk rm rn rt s sh ss st t th x".split()
_SUFFIXES = (
    "s es ed ing er ers ly tion tions ment ments ness able al ial ive ous ity ize ful less est ance ence".split()
)


def _pseudo_word(rng: random.Random) -> str:
    parts = []
    if rng.random() < 0.3:
        parts.append(rng.choice(_PREFIXES))
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        parts.append(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + (rng.choice(_CODAS) if rng.random() < 0.6 else ""))
    if rng.random() < 0.5:
        parts.append(rng.choice(_SUFFIXES))
    return "".join(parts)


def _sentences(seed: int, count: int) -> Iterator[str]:
    """Deterministic English-like sentences (mixed case, punctuation, digits, some code-ish text)."""
    rng = random.Random(seed)
    for index in range(count):
        words = [rng.choice(_WORDS) if rng.random() < 0.6 else _pseudo_word(rng) for _ in range(rng.randint(5, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randint(1, len(words) - 1), rng.choice(_CONNECTORS))
        if rng.random() < 0.15:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 100_000)))
        if rng.random() < 0.1:
            words.insert(rng.randint(0, len(words)), f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}()")
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            cut = rng.randint(1, len(words) - 1)
            words[cut - 1] += ","
        end = rng.choice((".", ".", ".", "?", "!", ":"))
        yield " ".join(words) + end + ("\n\n" if index % 7 == 6 else " ")


def _corpus(seed: int = 20240601, sentences: int = 15_000, lines: int = 200) -> Iterator[str]:
    batch: list[str] = []
    for sentence in _sentences(seed, sentences):
        batch.append(sentence)
        if len(batch) == lines:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def build_tokenizer_json(vocab_size: int = TOKENIZER_VOCAB_SIZE) -> str:
    """Train the byte-level BPE tokenizer and return its ``tokenizer.json`` text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    text: str = tokenizer.to_str(pretty=False)
    return text


def synthesize_model_dir(shape: str, out: Path, *, overwrite: bool = False) -> Path:
    """Write ``config.json``, ``generation_config.json``, ``tokenizer.json`` and
    ``tokenizer_config.json`` for ``shape`` into ``out`` (created; existing files are kept unless
    ``overwrite``). Returns ``out``."""
    config = shape_config(shape)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        existing = sorted(p.name for p in out.iterdir())
        raise FileExistsError(f"{out} is not empty ({', '.join(existing)}); pass overwrite=True to replace")

    tokenizer_json = build_tokenizer_json()
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    ids = {token: vocab[token] for token in SPECIAL_TOKENS}
    tokenizer_vocab = len(vocab)
    if tokenizer_vocab > config["vocab_size"]:  # pragma: no cover - guarded by TOKENIZER_VOCAB_SIZE
        raise ValueError(f"tokenizer vocabulary {tokenizer_vocab} exceeds {shape}'s vocab_size")

    config["bos_token_id"] = ids[BOS_TOKEN]
    config["eos_token_id"] = [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]]
    generation_config = {
        "bos_token_id": ids[BOS_TOKEN],
        "eos_token_id": [ids[END_OF_TEXT_TOKEN], ids[EOT_TOKEN]],
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOT_TOKEN,
        "pad_token": END_OF_TEXT_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": config["max_position_embeddings"],
        "added_tokens_decoder": {
            str(ids[token]): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token in SPECIAL_TOKENS
        },
        "chat_template": CHAT_TEMPLATE,
    }
    files = {
        "config.json": _dump(config),
        "generation_config.json": _dump(generation_config),
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": _dump(tokenizer_config),
        "kvbench-model.json": _dump(
            {"shape": shape, "weights": "none (use --load-format dummy)", "tokenizer_vocab_size": tokenizer_vocab}
        ),
    }
    # write into a sibling temp dir, then move the files in: a crash leaves no half-written model
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".kvbench-model-", dir=out.parent))
    try:
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        for name in files:
            (staging / name).replace(out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _dump(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


SYNTH_PREFIX = "synth:"
MODEL_CACHE_ENV = "KVBENCH_MODEL_CACHE"


def model_cache_root() -> Path:
    """Where ``synth:`` model directories are kept: $KVBENCH_MODEL_CACHE, else ~/.cache/kvbench/models."""
    configured = os.environ.get(MODEL_CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kvbench" / "models"


def resolve_model_ref(ref: str) -> Path:
    """A scenario's ``model:`` as a directory: a path as given, or ``synth:SHAPE`` built once and cached.

    The cache key covers the shape's config and the tokenizer builder, so a kvbench upgrade that
    changes either builds a fresh directory instead of reusing a stale one.
    """
    if not ref.startswith(SYNTH_PREFIX):
        return Path(ref)
    shape = ref.removeprefix(SYNTH_PREFIX)
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r} in {ref!r}; known shapes: {', '.join(shape_names())}")
    digest = hashlib.sha256(
        (_dump(shape_config(shape)) + f"tokenizer-vocab={TOKENIZER_VOCAB_SIZE}").encode()
    ).hexdigest()[:12]
    target = model_cache_root() / f"{shape}-{digest}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{shape}-", dir=target.parent))
    synthesize_model_dir(shape, staging, overwrite=True)
    try:
        staging.rename(target)
    except OSError:  # another process finished first; its copy is identical
        shutil.rmtree(staging, ignore_errors=True)
    return target
