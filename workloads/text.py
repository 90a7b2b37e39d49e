"""Deterministic synthetic text for prompts: documents, questions and filler.

Text is built from a fixed pool of common English words with a seeded generator, so the same
seed gives byte-identical prompts on every machine and every arm. Exact token counts come from
the target engine's tokenizer (see :func:`fit_to_tokens`), never from word counts.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from common.errors import KvbenchError

from .tokenizer import DescribedTokenizer, Tokenizer

WORDS: tuple[str, ...] = tuple(
    """
ability able about above accept according account across action activity actually address
administration admit adult affect after again against agency agent agree agreement ahead allow
almost alone along already also although always among amount analysis animal another answer anyone
anything appear apply approach area argue around arrive article artist assume attack attention
attorney audience author authority available avoid away baby back ball bank base beat beautiful
because become before begin behavior behind believe benefit best better between beyond bill billion
black blood blue board body book born both break bring brother budget build building business call
camera campaign cancer candidate capital card care career carry case catch cause cell center central
century certain certainly chair challenge chance change character charge check child choice choose
church citizen city civil claim class clear clearly close coach cold collection college color come
commercial common community company compare computer concern condition conference congress consider
consumer contain continue control cost could country couple course court cover create crime cultural
culture cup current customer dark data daughter dead deal death debate decade decide decision deep
defense degree democrat describe design despite detail determine develop development difference
different difficult dinner direction director discover discuss discussion disease doctor door down
draw dream drive drop drug during each early east easy economic economy edge education effect effort
eight either election else employee energy enjoy enough enter entire environment environmental
especially establish even evening event ever every everybody everyone everything evidence exactly
example executive exist expect experience expert explain face fact factor fail fall family far fast
father fear federal feel feeling field fight figure fill film final finally financial find fine
finger finish fire firm first fish five floor focus follow food foot force foreign forget form
former forward four free friend from front full fund future game garden general generation girl give
glass goal good government great green ground group grow growth guess hair half hand hang happen
happy hard have head health hear heart heat heavy help here herself high himself history hold home
hope hospital hotel hour house however huge human hundred husband idea identify image imagine impact
important improve include including increase indeed indicate individual industry information inside
instead institution interest interesting international interview into investment involve issue item
itself join just keep kind kitchen know knowledge land language large last late later laugh lawyer
lead leader learn least leave left legal less letter level life light like likely line list listen
little live local long look lose loss love machine magazine main maintain major majority make manage
management manager many market marriage material matter maybe mean measure media medical meet
meeting member memory mention message method middle might military million mind minute miss mission
model modern moment money month more morning most mother mouth move movement movie much music must
myself name nation national natural nature near nearly necessary need network never news newspaper
next nice night none north note nothing notice number occur offer office officer official often once
only onto open operation opportunity option order organization other others outside over owner page
pain painting paper parent part participant particular particularly partner party pass past patient
pattern peace people perform performance perhaps period person personal phone physical pick picture
piece place plan plant play player point police policy political politics poor popular population
position positive possible power practice prepare present president pressure pretty prevent price
private probably problem process produce product production professional professor program project
property protect prove provide public pull purpose push quality question quickly quite race radio
raise range rate rather reach read ready real reality realize really reason receive recent recently
recognize record reduce reflect region relate relationship religious remain remember remove report
represent republican require research resource respond response rest result return reveal rich right
rise risk road rock role room rule safe same save scene school science scientist score season seat
second section security seek seem sell send senior sense series serious serve service seven several
shake share shoot short shot should shoulder show side sign significant similar simple simply since
sing single sister site situation size skill skin small smile social society soldier some somebody
someone something sometimes song soon sort sound source south southern space speak special specific
speech spend sport spring staff stage stand standard star start state statement station stay step
still stock stop store story strategy street strong structure student study stuff style subject
success successful such suddenly suffer suggest summer support sure surface system table take talk
task teach teacher team technology television tell tend term test than thank that their them
themselves then theory there these they thing think third this those though thought thousand threat
three through throughout throw thus time today together tonight total tough toward town trade
traditional training travel treat treatment tree trial trip trouble true truth turn type under
understand unit until upon usually value various very victim view violence visit voice vote wait
walk wall want watch water weapon wear week weight well west western what whatever when where
whether which while white whole whose wide wife will wind window wish with within without woman
wonder word work worker world worry would write writer wrong yard yeah year young yourself
""".split()
)


def sentence(rng: random.Random, words: int) -> str:
    chosen = [rng.choice(WORDS) for _ in range(words)]
    return " ".join(chosen).capitalize() + "."


def paragraph_text(rng: random.Random, approx_words: int) -> str:
    """Sentences of 8 to 20 words until about ``approx_words`` words have been produced."""
    parts: list[str] = []
    produced = 0
    while produced < approx_words:
        length = rng.randint(8, 20)
        parts.append(sentence(rng, length))
        produced += length
    return " ".join(parts)


class TokenFitError(KvbenchError, RuntimeError):
    """The tokenizer never produced the requested count (one that is not prefix-stable, or that lies); the
    message names the tokenizer and what it answered, in one line."""


GROW_STEPS = 8
"""Times the text is grown (at least doubled) to reach the count: 256x the first guess, far past any real tokenizer."""
TRIM_STEPS = 8
"""Decode-and-recount tries to land on the exact count."""


@runtime_checkable
class Located(Protocol):
    """A tokenizer served from somewhere (an endpoint's ``/tokenize``): errors name where."""

    @property
    def location(self) -> str: ...


def tokenizer_name(tokenizer: Tokenizer) -> str:
    """What it is (its description, else its type) and, when served from somewhere, where."""
    name = tokenizer.description if isinstance(tokenizer, DescribedTokenizer) else type(tokenizer).__name__
    return f"{name} at {tokenizer.location}" if isinstance(tokenizer, Located) and tokenizer.location else name


async def _yield() -> None:
    """A cancellation point. A local tokenizer's ``async`` methods never suspend, so without these a
    run building many long prompts would not see Ctrl-C (a cancellation of its task) until all were
    built; with them it stops within one step (about a second for a 2M-token prompt)."""
    await asyncio.sleep(0)


async def fit_to_tokens(tokenizer: Tokenizer, header: str, rng: random.Random, tokens: int) -> str:
    """Text of exactly ``tokens`` tokens for ``tokenizer``: ``header`` followed by seeded prose.

    Generates a little more prose than needed, encodes it, cuts the ids to length, decodes and
    re-encodes to confirm; a cut in the middle of a merge can shift the count by one or two, so a
    few tokens are trimmed or added until the count is exact. Both steps are bounded
    (:data:`GROW_STEPS`, :data:`TRIM_STEPS`): a tokenizer that answers too few tokens, or whose decode
    does not round-trip, is a :class:`TokenFitError` naming it and its answers, never an endless loop.
    """
    words = max(8, int(tokens * 1.2) + 16)
    text = header + paragraph_text(rng, words)
    await _yield()
    ids = await tokenizer.encode(text)
    await _yield()
    for _ in range(GROW_STEPS):
        if len(ids) >= tokens:
            break
        more = max(tokens - len(ids) + 16, words)  # at least doubles: a short answer cannot keep it looping
        text += " " + paragraph_text(rng, more)
        words += more
        ids = await tokenizer.encode(text)
        await _yield()
    if len(ids) < tokens:
        raise TokenFitError(
            f"{tokenizer_name(tokenizer)} answered {len(ids)} tokens for {len(text)} characters of text "
            f"({words} words) after {GROW_STEPS} tries; a prompt of {tokens} tokens cannot be built from its counts"
        )
    target = tokens
    count = len(ids)
    for _ in range(TRIM_STEPS):
        candidate = await tokenizer.decode(ids[:target])
        count = len(await tokenizer.encode(candidate))
        await _yield()
        if count == tokens:
            return candidate
        target += tokens - count
        if target <= 0 or target > len(ids):
            break
    raise TokenFitError(
        f"{tokenizer_name(tokenizer)}: could not build a prompt of exactly {tokens} tokens: decoding ids and "
        f"encoding the text again gave {count} tokens (its decode and encode do not agree)"
    )


def join_nonempty(parts: Sequence[str], separator: str = "\n\n") -> str:
    return separator.join(part for part in parts if part)
