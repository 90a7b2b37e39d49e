"""The client and the attach path against endpoints that misbehave (:mod:`tests.fakes.hostile_openai`, aiohttp
servers on 127.0.0.1 started here):

* a redirect to another origin is refused before it is followed, naming both URLs, and is not retried; one
  within the origin is followed and remembered;
* an endless stream is cut off past ``2 * max_tokens`` chunks; a stall fails as one, and an attached endpoint
  gets a default stall limit; a request waiting for its first byte is noted;
* ``usage.prompt_tokens`` no tokenizer could give for the prompt is refused; one merely above it is noted once;
* 401/403 are not retried, anywhere; a chat-only server (no ``/health``, ``/v1/models``, ``/tokenize``) attaches;
* a ``/tokenize`` that answers too few tokens, or a ``/detokenize`` that lies, ends prompt building in a bounded
  number of calls with a one-line error;
* a base URL with ``?query`` or ``#fragment`` is refused; two arms on one URL are noted, or refused when their
  profiles are the same.
"""

from __future__ import annotations

import random
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from common.errors import EngineStartError, KvbenchError, ScenarioError
from harness.client import openai as client_module
from harness.client.connections import new_session
from harness.client.endpoint import Endpoint
from harness.client.openai import ATTACHED_STALL_TIMEOUT_S, OpenAIClient, RequestOutcome
from harness.client.redirects import SEEN
from harness.engines.base import LaunchContext, stall_limit
from harness.engines.common import ServerTokenizer
from harness.engines.configs import OpenAIEngineConfig
from harness.engines.openai import OpenAIEngine, endpoint_tokenizer, refuse_query_or_fragment, shared_url_note
from offload.profiles import BUILTIN_PROFILES
from tests.fakes.hostile_openai import MODEL, MOVED, Hostile, hostile_openai
from workloads.text import GROW_STEPS, TRIM_STEPS, TokenFitError, fit_to_tokens

PROMPT = "Tell me about the history of the city in a few words, please."


async def chat(
    how: Hostile, max_tokens: int = 8, notes: list[str] | None = None, read_timeout_s: float | None = None
) -> RequestOutcome:
    endpoint = Endpoint(base_url=how.base_url, model=MODEL)
    on_note = notes.append if notes is not None else None
    async with OpenAIClient(endpoint, timeout_s=10.0, on_note=on_note, read_timeout_s=read_timeout_s) as client:
        return await client.chat([{"role": "user", "content": PROMPT}], max_tokens)


async def test_a_redirect_to_another_origin_is_refused_naming_both_urls() -> None:
    with hostile_openai(Hostile()) as elsewhere, hostile_openai(Hostile()) as endpoint:
        endpoint.redirect_to = elsewhere.root
        outcome = await chat(endpoint)
    assert outcome.error_kind == "http_status" and outcome.permanent
    assert outcome.error is not None
    assert f"{endpoint.root}/v1/chat/completions redirected (HTTP 307) to {elsewhere.root}/v1/chat/completions" in (
        outcome.error
    )
    assert "another origin" in outcome.error
    assert elsewhere.seen == []  # never sent: its TTFT cannot pass for the endpoint's


async def test_a_same_origin_redirect_is_followed_and_remembered() -> None:
    with hostile_openai(Hostile()) as endpoint:
        endpoint.redirect_to = endpoint.root + MOVED
        outcome = await chat(endpoint)
    assert outcome.ok, outcome.error
    assert endpoint.seen[-2:] == ["POST /v1/chat/completions", f"POST {MOVED}/v1/chat/completions"]
    assert SEEN[f"{endpoint.root}/v1/chat/completions"] == f"{endpoint.root}{MOVED}/v1/chat/completions"


async def test_an_endless_stream_is_cut_off_past_twice_max_tokens() -> None:
    with hostile_openai(Hostile(endless=True)) as endpoint:
        started = time.monotonic()
        outcome = await chat(endpoint, max_tokens=5)
    assert time.monotonic() - started < 5
    assert outcome.error_kind == "malformed_frame"
    limit = 2 * 5 + client_module.RUNAWAY_SLACK_FRAMES
    assert outcome.error == (
        f"the stream went on past {limit} chunks (2 x max_tokens + 64) without data: [DONE]; stopped reading"
    )
    assert limit - 2 <= outcome.output_chunks <= limit  # what was read up to the cut is kept


async def test_a_stall_fails_naming_it_and_a_wait_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "WAITING_NOTE_S", 0.3)
    notes: list[str] = []
    with hostile_openai(Hostile(stall_s=2.0)) as endpoint:
        outcome = await chat(endpoint, notes=notes, read_timeout_s=1.0)
    assert outcome.error_kind == "timeout" and outcome.error is not None
    assert "connection silent for longer than stall_timeout_s=1" in outcome.error and "stalled" in outcome.error
    assert notes and notes[0] == f"waiting for first token from {endpoint.base_url}/chat/completions for 0.3 s"


async def test_bytes_that_trickle_in_without_an_event_are_a_stall() -> None:
    with hostile_openai(Hostile(trickle_s=0.1)) as endpoint:
        started = time.monotonic()
        outcome = await chat(endpoint, read_timeout_s=1.0)
    assert time.monotonic() - started < 4  # the stall limit, not the 10 s total
    assert outcome.error_kind == "timeout"
    assert outcome.error == "bytes trickled in but no event for longer than stall_timeout_s=1: the endpoint stalled"


def test_an_attached_endpoint_gets_a_default_stall_limit_and_a_started_one_does_not() -> None:
    class Attached:
        pass

    class Started:
        def exit_code(self) -> int | None:
            return None

    assert stall_limit(None, Attached()) == ATTACHED_STALL_TIMEOUT_S  # type: ignore[arg-type]
    assert stall_limit(None, Started()) is None  # type: ignore[arg-type]
    assert stall_limit(7.0, Attached()) == 7.0  # type: ignore[arg-type]


async def test_a_prompt_count_no_tokenizer_gives_is_refused_and_a_high_one_noted_once() -> None:
    notes: list[str] = []
    with hostile_openai(Hostile(usage_prompt_tokens=1_000_000)) as endpoint:
        refused = await chat(endpoint, notes=notes)
        endpoint.usage_prompt_tokens = 300  # above the prompt's bytes + template, below the refusal
        first, second = await chat(endpoint, notes=notes), await chat(endpoint, notes=notes)
    size = len(PROMPT.encode()) + 2  # the JSON string's quotes
    assert refused.error_kind == "malformed_frame" and refused.permanent and refused.error is not None
    assert refused.error.startswith(f"usage.prompt_tokens=1000000 for a prompt of {size} bytes")
    assert first.ok and second.ok and first.prompt_tokens == 300
    assert len(notes) == 2  # one client per chat() call: each says it once
    assert "usage.prompt_tokens=300" in notes[1]


async def test_refused_credentials_are_permanent_and_other_statuses_are_not() -> None:
    with hostile_openai(Hostile(status=401)) as endpoint:
        refused = await chat(endpoint)
        endpoint.status = 503
        busy = await chat(endpoint)
    assert refused.http_status == 401 and refused.permanent
    assert busy.http_status == 503 and not busy.permanent


def attach(how: Hostile, tmp_path: Path, startup_timeout_s: float = 30.0) -> OpenAIEngine:
    config = OpenAIEngineConfig(kind="openai", model=MODEL, base_url=how.base_url, startup_timeout_s=startup_timeout_s)
    context = LaunchContext(arm="A", profile=BUILTIN_PROFILES["hbm"], log_dir=tmp_path, prefix_caching=True)
    return OpenAIEngine(config, context)


async def test_attaching_with_refused_credentials_fails_at_once(tmp_path: Path) -> None:
    with hostile_openai(Hostile(status=403)) as endpoint:
        started = time.monotonic()
        with pytest.raises(EngineStartError, match="answered HTTP 403 Forbidden: the endpoint refused") as error:
            async with attach(endpoint, tmp_path):
                pass
        assert time.monotonic() - started < 5  # not the 30 s startup wait
        assert endpoint.seen == ["GET /health"]
    assert "\n" not in str(error.value)


def self_signed(tmp_path: Path) -> ssl.SSLContext:
    """A server context with a certificate no client trusts (made by ``openssl``)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run([*argv, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_a_rejected_certificate_is_not_retried(tmp_path: Path) -> None:
    with hostile_openai(Hostile(), tls=self_signed(tmp_path)) as endpoint:
        outcome = await chat(endpoint)
        started = time.monotonic()
        with pytest.raises(EngineStartError, match=r"TLS failed .*not retried: fix the certificate") as error:
            async with attach(endpoint, tmp_path):
                pass
        assert time.monotonic() - started < 5  # not the 30 s startup wait
    assert outcome.error_kind == "connection" and outcome.permanent
    assert "Certificate" in (outcome.error or "") and "\n" not in str(error.value)


async def test_a_chat_only_server_attaches_and_is_measured(tmp_path: Path) -> None:
    with hostile_openai(Hostile(chat_only=True)) as endpoint:
        async with attach(endpoint, tmp_path, startup_timeout_s=5.0) as running:
            async with OpenAIClient(running.endpoint, timeout_s=5.0) as client:
                outcome = await client.chat([{"role": "user", "content": PROMPT}], 4)
            facts = running.facts
    assert outcome.ok, outcome.error
    assert "no POST /tokenize" in facts.details["prompts_built_with"]


async def test_a_tokenize_that_answers_too_few_tokens_ends_in_bounded_calls() -> None:
    with hostile_openai(Hostile(tokenize_tokens=3)) as endpoint:
        async with new_session(timeout=aiohttp.ClientTimeout(total=10)) as session:
            tokenizer = await endpoint_tokenizer(session, endpoint.root, MODEL, None)
            with pytest.raises(TokenFitError) as error:
                await fit_to_tokens(tokenizer, "Header. ", random.Random(1), 200)
        calls = endpoint.seen.count("POST /tokenize")
    assert calls == GROW_STEPS + 2  # the attach-time probe, the first count, each growth
    message = str(error.value)
    assert message.startswith(f"the server's POST /tokenize at {endpoint.root}/tokenize answered 3 tokens for")
    assert "a prompt of 200 tokens cannot be built" in message
    assert isinstance(error.value, KvbenchError) and "\n" not in message


async def test_a_lying_detokenize_is_a_one_line_error() -> None:
    with hostile_openai(Hostile(detokenize_text="nothing like it")) as endpoint:
        async with new_session(timeout=aiohttp.ClientTimeout(total=10)) as session:
            tokenizer = ServerTokenizer(session, endpoint.root, MODEL)
            with pytest.raises(TokenFitError, match="could not build a prompt of exactly 200 tokens") as error:
                await fit_to_tokens(tokenizer, "Header. ", random.Random(1), 200)
        assert endpoint.seen.count("POST /detokenize") <= TRIM_STEPS
    assert "gave 3 tokens" in str(error.value) and "\n" not in str(error.value)


def test_a_base_url_with_a_query_or_fragment_is_refused() -> None:
    assert refuse_query_or_fragment("http://h:1/v1", "--base-url") == "http://h:1/v1"
    for url in ("http://h:1/v1?key=x", "http://h:1/#top", "http://h:1/v1?"):
        with pytest.raises(ScenarioError, match=r"^--base-url .*: give the server's root URL without \?query"):
            refuse_query_or_fragment(url, "--base-url")


def test_two_arms_on_one_url_are_noted_or_refused_when_their_profiles_match() -> None:
    config = OpenAIEngineConfig(
        kind="openai", model="m", arm_urls={"A": "http://h:1/v1", "B": "http://h:1/", "C": "http://h:2"}
    )
    note = shared_url_note(config, [("A", "hbm"), ("B", "cpu"), ("C", "hbm")])
    assert note == (
        "note: arms A, B measure the same URL http://h:1: one server, so their difference is what changed on it "
        "between the arms, if anything"
    )
    with pytest.raises(KvbenchError, match="arms A, B measure the same URL http://h:1 with the same offload profile"):
        shared_url_note(config, [("A", "hbm"), ("B", "hbm")])
    assert shared_url_note(config, [("A", "hbm"), ("C", "hbm")]) is None
