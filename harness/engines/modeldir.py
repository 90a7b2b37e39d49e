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
text generated from a fixed word list and a fixed seed (at most :data:`TOKENIZER_VOCAB_SIZE`
trained entries), then **padded to the shape's** ``vocab_size`` so that every id random weights
can emit decodes to text. A client times the first chunk that carries text; an id that
decoded to nothing would hide the first token and push TTFT past one or more decode steps (an
earlier version, with only the trained 8192 entries, streamed text for about half of the tokens of
the Llama-3.1-8B shape and none at all for Llama-3.1-70B). Concretely:

* Filler entries ``~`` + a fixed-width base-62 number (``~000``, ``~001``, ...) take the ids from
  the trained size up to ``vocab_size - 1``. They are plain vocabulary entries in the byte-level
  alphabet with no merges, so encoding never produces them and the encoding of any text is the
  same as with the trained vocabulary alone; ``~`` does not occur in the training text, so no
  trained entry collides with them.
* The decoder is the plain ``ByteLevel`` one. Engines detokenize on the request path (vLLM 0.26.0
  evidently decodes whole prompts there), so a slower decoder shows up in TTFT: a first version that
  put a ``Replace`` per byte in front of it to show lone bytes as markers made decoding 100 times
  slower and added about 45 us per prompt token to every TTFT on an H100. The 128 single-byte
  entries 0x80-0xFF therefore keep decoding as themselves: alone they are not valid UTF-8, which a
  streaming detokenizer holds back until the next token (0.1 % of the Llama ids); the 29 ASCII
  control bytes decode to one (invisible, non-empty) character each.
* The five special tokens keep their ids (0-4); ``bos_token_id``/``eos_token_id`` in
  ``config.json`` and ``generation_config.json`` point at them. Servers skip special tokens when
  detokenizing, so these five ids (of 128,256 for Llama) stream no text, and an emitted
  ``<|eot_id|>`` would end the answer: kvbench's workloads send ``ignore_eos`` (the default of
  every workload's ``ignore_eos``), and the run summary counts answers shorter than
  ``answer_tokens`` and text-bearing chunks per generated token, so neither goes unnoticed.

Special tokens and the chat template follow Llama 3's layout (``<|begin_of_text|>``,
``<|start_header_id|>role<|end_header_id|>``, ``<|eot_id|>``). The output is byte-for-byte
deterministic; ``tokenizer.json`` is about 2-3 MB for the 128k-152k vocabularies.
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
FILLER_PREFIX = "~"
"""First character of every filler entry (absent from the training text)."""
_FILLER_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
TOKENIZER_LAYOUT = 2
"""Version of the tokenizer layout (trained vocabulary + fillers + byte markers); part of the cache key."""
CONFIG_TRANSFORMERS_VERSION = "4.43.0"
"""``transformers_version`` in the written config.json (Llama-3.1's own config says 4.43.0.dev0); part of the cache
key. transformers 5.x treats a local config.json without it as a possible Mistral checkpoint and logs "incorrect
regex pattern … will lead to incorrect tokenization" in every engine start, though it changes nothing."""

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


def filler_token(index: int, width: int) -> str:
    """The filler entry number ``index``: ``~`` and ``index`` in base 62, ``width`` digits."""
    digits = []
    for _ in range(width):
        index, digit = divmod(index, len(_FILLER_DIGITS))
        digits.append(_FILLER_DIGITS[digit])
    if index:
        raise ValueError(f"filler index does not fit {width} base-62 digits")
    return FILLER_PREFIX + "".join(reversed(digits))


def pad_tokenizer_json(tokenizer_json: str, vocab_size: int) -> str:
    """Pad a trained byte-level BPE ``tokenizer.json`` to ``vocab_size`` ids with filler entries.

    The fillers have no merges, so encoding is unchanged; the decoder stays the plain ``ByteLevel``
    one, so decoding costs what it costs for a real model's tokenizer.
    """
    data = json.loads(tokenizer_json)
    vocab: dict[str, int] = data["model"]["vocab"]
    trained = len(vocab)
    if sorted(vocab.values()) != list(range(trained)):
        raise ValueError("the trained vocabulary's ids are not 0..n-1")
    if trained > vocab_size:
        raise ValueError(f"trained vocabulary of {trained} entries exceeds vocab_size {vocab_size}")
    count = vocab_size - trained
    width = 1
    while len(_FILLER_DIGITS) ** width < count:
        width += 1
    for index in range(count):
        token = filler_token(index, width)
        if token in vocab:  # pragma: no cover - the training text has no "~"
            raise ValueError(f"filler {token!r} collides with a trained entry")
        vocab[token] = trained + index
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def synthesize_model_dir(shape: str, out: Path, *, overwrite: bool = False) -> Path:
    """Write ``config.json``, ``generation_config.json``, ``tokenizer.json`` and
    ``tokenizer_config.json`` for ``shape`` into ``out`` (created; existing files are kept unless
    ``overwrite``). Returns ``out``."""
    config = shape_config(shape)
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        existing = sorted(p.name for p in out.iterdir())
        raise FileExistsError(f"{out} is not empty ({', '.join(existing)}); pass overwrite=True to replace")

    trained_json = build_tokenizer_json()
    trained_vocab = len(json.loads(trained_json)["model"]["vocab"])
    tokenizer_json = pad_tokenizer_json(trained_json, config["vocab_size"])
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    ids = {token: vocab[token] for token in SPECIAL_TOKENS}
    tokenizer_vocab = len(vocab)

    config["transformers_version"] = CONFIG_TRANSFORMERS_VERSION
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
            {
                "shape": shape,
                "weights": "none (use --load-format dummy)",
                "tokenizer_vocab_size": tokenizer_vocab,
                "trained_vocab_size": trained_vocab,
                "filler_prefix": FILLER_PREFIX,
                "tokenizer_layout": TOKENIZER_LAYOUT,
            }
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
        (
            _dump(shape_config(shape))
            + f"tokenizer-vocab={TOKENIZER_VOCAB_SIZE} layout={TOKENIZER_LAYOUT}"
            + f" transformers={CONFIG_TRANSFORMERS_VERSION}"
        ).encode()
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
