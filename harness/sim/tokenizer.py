"""The simulator's tokenizer: deterministic, exactly reversible, about one token per English word.

Text is cut into pieces by one regular expression, and each piece maps to one or more ids. The
pieces partition the text and every id decodes to exactly the characters it came from, so
``decode(encode(text)) == text`` for *any* string (including unusual whitespace, emoji or lone
surrogates). Nothing depends on Python's per-process string hashing, so ids are identical in every
process and on every machine.

Pieces, in the order the expression tries them:

1. the chat template's special tokens ``<|start|>`` and ``<|end|>``;
2. a run of ASCII letters with an optional single leading space (`` hello``, ``World``): one id if
   the word (lower case, or capitalised) is in the built-in vocabulary of common English words;
   otherwise split into sub-words of one letter (any case) followed by up to two lower-case
   letters (`` Zor`` ``bla`` ``x``), each one id -- roughly what a BPE vocabulary does to a rare
   word;
3. one ASCII digit or punctuation character with an optional leading space (`` 7``, ``,``);
4. any other single character (newline, tab, a second space, non-ASCII): the per-character
   fallback, id ``CHAR_BASE + ord(char)``.

Id layout: special tokens from 0, vocabulary words from ``WORD_BASE`` (four ids per word: ``w``,
`` w``, ``W``, `` W``), spaced symbols from ``SPACED_SYMBOL_BASE``, sub-words (computed, not
stored) from ``SUBWORD_BASE``, characters from ``CHAR_BASE``.

Chat template (:func:`apply_chat_template`): each message becomes
``<|start|>{role}\\n{content}<|end|>\\n``; with ``add_generation_prompt`` the prompt ends with
``<|start|>assistant\\n``. No BOS token is added, for prompts or messages.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

SPECIAL_TOKENS: tuple[str, ...] = ("<|start|>", "<|end|>")

# Common English words (function words first), the chat roles, then a second list of frequent
# content words. Every entry is lower-case ASCII letters; duplicates are dropped (first wins).
# Ids depend on this order: append, never insert.
_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one have this from
or had by not word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long
make thing see him two has look more day could go come did number sound no most people my over
know water than call first who may down side been now find any new work part take get place made
live where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start might story
saw far sea draw left late run while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those both mark often
letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family direct pose
leave song measure door product black short numeral class wind question happen complete ship
area half rock order fire south problem piece told knew pass since top whole king space heard
best hour better true during hundred five remember step early hold west ground interest reach
fast verb sing listen six table travel less morning ten simple several vowel toward war lay
against pattern slow center love person money serve appear road map rain rule govern pull cold
notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure
star box noun field rest correct able pound done beauty drive stood contain front teach week
final gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide surface
deep moon island foot system busy test record boat common gold possible plane stead dry wonder
laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes distant
fill east paint language among cache memory model token tokens user assistant context prompt
request response data value question answer document section summary report table result
results system prefix offload server client latency throughput engine batch layer layers
attention key query vector matrix compute bandwidth storage disk network cluster node service
time times first last based using used use given following however therefore because about into
ability accept according account across action activity actually address administration admit adult
affect agency agent agree agreement ahead allow almost alone along already although amount analysis
another anyone anything apply approach argue around arrive article artist assume attack attorney
audience author authority available avoid away baby ball bank beat beautiful become behavior believe
benefit beyond bill billion blood board born break brother budget building business camera campaign
cancer candidate capital card career case catch cell central century certainly chair challenge
chance character charge child choice choose church citizen civil claim clearly coach collection
college commercial community company compare computer concern condition conference congress consider
consumer continue control cost couple court create crime cultural culture cup current customer
daughter dead deal death debate decade decision defense degree democrat describe design despite
detail determine development difference different difficult dinner direction director discover
discuss discussion disease doctor dream drop drug easy economic economy edge education effect effort
eight either election else employee energy enjoy enter entire environment environmental especially
establish evening event everybody everyone everything evidence exactly executive exist expect
experience expert explain factor fail fear federal feeling fight film finally financial finger
finish firm floor focus foreign forget former forward fund future garden general generation glass
goal government growth guess hair hang happy health heart heavy herself himself history hope
hospital hotel huge human husband identify image imagine impact important improve include including
increase indeed indicate individual industry information inside instead institution interesting
international interview investment involve issue item itself join kitchen knowledge later lawyer
leader least legal level likely local lose loss magazine maintain major majority manage management
manager market marriage material matter maybe media medical meet meeting member mention message
method middle military million mission modern moment month mouth movement movie myself nation
national natural nature nearly necessary news newspaper nice none occur offer office officer
official onto operation opportunity option organization others outside owner pain painting parent
participant particular particularly partner party past patient peace perform performance perhaps
period personal phone physical pick player police policy political politics poor popular population
position positive practice prepare present president pressure pretty prevent price private probably
process production professional professor program project property protect prove provide public
purpose push quality quickly quite race radio raise range rate rather reality realize really reason
receive recent recently recognize reduce reflect region relate relationship religious remain remove
represent republican require research resource respond return reveal rich rise risk role safe save
scene scientist score season seat security seek sell send senior sense series serious seven shake
share shoot shot shoulder sign significant similar simply single sister site situation size skill
skin smile social society soldier somebody someone something sometimes sort source southern speak
specific speech spend sport spring staff stage standard statement station stock store strategy
structure student stuff style subject success successful suddenly suffer suggest summer support task
teacher team technology television tend term thank themselves theory third threat throughout throw
thus today tonight total tough trade traditional training treat treatment trial trip trouble truth
type understand upon usually various victim view violence visit vote wall weapon wear weight western
whatever whether whose wide wife window wish within without woman worker worry writer wrong yard
yeah yourself
""".split()


def _unique(words: Iterable[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for word in words:
        seen.setdefault(word, None)
    return tuple(seen)


WORDS: tuple[str, ...] = _unique(_WORDS)

_LETTERS = string.ascii_lowercase + string.ascii_uppercase  # 52 possible first letters
_SYMBOLS = string.digits + string.punctuation  # 42 ASCII characters that take a leading space

WORD_BASE = 16
SPACED_SYMBOL_BASE = WORD_BASE + 4 * len(WORDS)
SUBWORD_BASE = SPACED_SYMBOL_BASE + len(_SYMBOLS)
# sub-word = optional space (2) x first letter (52) x up to two more lower-case letters (1 + 26 + 26^2)
_TAIL_CODES = 1 + 26 + 26 * 26
SUBWORD_COUNT = 2 * 52 * _TAIL_CODES
CHAR_BASE = SUBWORD_BASE + SUBWORD_COUNT
VOCAB_SIZE = CHAR_BASE + 0x110000

_PIECE = re.compile(
    r"<\|(?:start|end)\|>|"  # special tokens
    r" ?[A-Za-z]+|"  # words
    r" ?[0-9!-/:-@\[-`{-~]|"  # a digit or an ASCII punctuation character
    r".",  # anything else, one character at a time
    re.DOTALL,
)
_SUBWORD = re.compile(r"[A-Za-z][a-z]{0,2}")

_PIECE_TO_ID: dict[str, int] = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
for _index, _word in enumerate(WORDS):
    for _offset, _form in enumerate((_word, " " + _word, _word.capitalize(), " " + _word.capitalize())):
        _PIECE_TO_ID[_form] = WORD_BASE + 4 * _index + _offset
for _index, _symbol in enumerate(_SYMBOLS):
    _PIECE_TO_ID[" " + _symbol] = SPACED_SYMBOL_BASE + _index
# Single characters are in the table too, so the hot path is one dict lookup per piece.
for _char in string.printable:
    _PIECE_TO_ID.setdefault(_char, CHAR_BASE + ord(_char))

# The inverse table for every id below SUBWORD_BASE (the rest are computed when decoding).
_TABLE_IDS: list[str] = [""] * SUBWORD_BASE
for _piece, _id in _PIECE_TO_ID.items():
    if _id < SUBWORD_BASE:
        _TABLE_IDS[_id] = _piece


def _subword_id(space: bool, chunk: str) -> int:
    # tail code: "" -> 0, one letter -> 1..26, two letters -> 27..702
    if len(chunk) == 1:
        tail = 0
    elif len(chunk) == 2:
        tail = 1 + ord(chunk[1]) - 97
    else:
        tail = 27 + (ord(chunk[1]) - 97) * 26 + (ord(chunk[2]) - 97)
    return SUBWORD_BASE + ((1 if space else 0) * 52 + _LETTERS.index(chunk[0])) * _TAIL_CODES + tail


def _subword_text(token_id: int) -> str:
    code = token_id - SUBWORD_BASE
    head, tail = divmod(code, _TAIL_CODES)
    space, first = divmod(head, 52)
    text = (" " if space else "") + _LETTERS[first]
    if tail == 0:
        return text
    if tail <= 26:
        return text + chr(96 + tail)
    second, third = divmod(tail - 27, 26)
    return text + chr(97 + second) + chr(97 + third)


@functools.lru_cache(maxsize=65536)
def _encode_piece(piece: str) -> tuple[int, ...]:
    """Ids of a piece that is not in the table (a rare word, or a non-ASCII character)."""
    if len(piece) == 1:
        return (CHAR_BASE + ord(piece),)
    space = piece.startswith(" ")
    word = piece[1:] if space else piece
    if not word.isascii() or not word.isalpha():
        return tuple(CHAR_BASE + ord(char) for char in piece)
    ids = []
    for index, match in enumerate(_SUBWORD.finditer(word)):
        ids.append(_subword_id(space and index == 0, match.group()))
    return tuple(ids)


def encode_by_pieces(text: str) -> list[int]:
    """Token ids of ``text``, straight from the definition (one regex pass; the reference)."""
    table = _PIECE_TO_ID
    ids: list[int] = []
    append = ids.append
    for piece in _PIECE.findall(text):
        token = table.get(piece)
        if token is not None:
            append(token)
        else:
            ids.extend(_encode_piece(piece))
    return ids


@functools.lru_cache(maxsize=65536)
def _encode_part(part: str) -> tuple[int, ...]:
    return tuple(encode_by_pieces(part))


# A piece holds at most one space, at its start, so the pieces of a text are the pieces of its
# space-separated parts, each with the space before it. Most parts of English prose are one
# piece, found with one dict lookup: ``_SPACED_PART`` maps ``part`` to the id of ``" " + part``.
_SPACED_PART: dict[str, int] = {piece[1:]: token for piece, token in _PIECE_TO_ID.items() if piece.startswith(" ")}
_SPACED_PART[""] = _PIECE_TO_ID[" "]  # two spaces in a row: the second is a piece of its own


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens are added); equal to :func:`encode_by_pieces`.

    Splitting on spaces and looking whole parts up is several times faster than the regex pass
    for long prompts, and falls back to it part by part.
    """
    parts = text.split(" ")
    ids: list[int] = list(_encode_part(parts[0])) if parts[0] else []
    rest = parts[1:]
    found = list(map(_SPACED_PART.get, rest))
    if None not in found:
        ids.extend(cast("list[int]", found))  # no None in it, checked above
        return ids
    append = ids.append
    for part, token in zip(rest, found, strict=True):
        if token is not None:
            append(token)
        else:
            ids.extend(_encode_part(" " + part))
    return ids


def token_text(token_id: int) -> str:
    """The exact text of one token id."""
    if 0 <= token_id < SUBWORD_BASE:
        text = _TABLE_IDS[token_id]
        if text:
            return text
    elif SUBWORD_BASE <= token_id < CHAR_BASE:
        return _subword_text(token_id)
    elif CHAR_BASE <= token_id < VOCAB_SIZE:
        return chr(token_id - CHAR_BASE)
    raise ValueError(f"token id {token_id} is not in the simulator vocabulary")


def decode(token_ids: Iterable[int]) -> str:
    """The text of ``token_ids`` (the inverse of :func:`encode`)."""
    table = _TABLE_IDS
    parts: list[str] = []
    append = parts.append
    for token_id in token_ids:
        if SPACED_SYMBOL_BASE > token_id >= WORD_BASE:
            append(table[token_id])
        else:
            append(token_text(token_id))
    return "".join(parts)


def message_text(content: Any) -> str:
    """The text of a chat message's ``content``: a string, or OpenAI content parts of type text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def apply_chat_template(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat (see the module docstring for the template)."""
    parts: list[str] = []
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError("every message needs a non-empty string 'role'")
        parts.append(f"<|start|>{role}\n{message_text(message.get('content'))}<|end|>\n")
    if add_generation_prompt:
        parts.append("<|start|>assistant\n")
    return "".join(parts)


def _generated_word_ids() -> tuple[tuple[int, ...], tuple[int, ...]]:
    # The words the simulator "generates": vocabulary words, bare for the first token of an
    # answer and with a leading space after it, so an answer re-encodes to the same ids.
    bare = tuple(_PIECE_TO_ID[word] for word in WORDS[:400])
    spaced = tuple(_PIECE_TO_ID[" " + word] for word in WORDS[:400])
    return bare, spaced


GENERATED_FIRST_IDS, GENERATED_NEXT_IDS = _generated_word_ids()


class SimTokenizer:
    """The simulator tokenizer behind the harness ``Tokenizer`` Protocol (plus sync methods)."""

    vocab_size = VOCAB_SIZE

    def encode_sync(self, text: str) -> list[int]:
        return encode(text)

    def decode_sync(self, token_ids: Sequence[int]) -> str:
        return decode(token_ids)

    def chat_ids(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        return encode(apply_chat_template(messages, add_generation_prompt))

    async def encode(self, text: str) -> list[int]:
        return encode(text)

    async def prompt_ids(self, text: str) -> list[int]:
        return encode(text)  # the simulator's completions add no special token to a text prompt

    async def decode(self, token_ids: Sequence[int]) -> str:
        return decode(token_ids)
