"""What the engine kinds share: HTTP helpers, tokenizers, the running-engine base and launch steps.

The engine modules (:mod:`~harness.engines.vllm`, :mod:`~harness.engines.sglang`,
:mod:`~harness.engines.trtllm`, :mod:`~harness.sim.engine`,
:mod:`~harness.engines.openai`) build on these pieces, so that each says only what is
particular to its engine:

* :func:`post_text` and :func:`reset_with_retry`: a POST whose transport failures become
  :class:`EngineRequestError`, and the prefix-cache reset an engine may refuse for a while;
* :class:`ServerTokenizer` (the server's ``POST /tokenize`` / ``/detokenize``, optionally falling
  back to a local tokenizer) and :class:`ModelDirTokenizer` (a model directory's ``tokenizer.json``);
* :class:`RunningServer` / :class:`RunningProcess`: the endpoint, facts, pid and log tail of a
  :class:`~harness.engines.base.RunningEngine`;
* :class:`ProcessEngine`: the ``async with`` lifecycle of an engine kvbench starts (an exit stack,
  an optional temporary directory), and :func:`start_server` (:func:`server_process` to start it
  with others) / :func:`open_session` for its steps;
* :func:`served_model_name`, :func:`resolve_served_model`, :func:`resolve_python`,
  :func:`probe_python`, :func:`make_offload_dirs` and :func:`server_version`: small steps more
  than one engine takes the same way;
* :func:`remove_session_dirs`: the runner's cleanup of an engine session's tier subdirectories
  (:func:`offload.profiles.tier_dir`) once its engines have stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Generic, Protocol, TypeVar

import aiohttp

from common.errors import EngineStartError, KvbenchError
from common.redact import redact_text
from harness.client.connections import idempotent_request, new_session
from harness.client.endpoint import Endpoint
from offload.profiles import OffloadProfile, session_dirs
from workloads.tokenizer import Tokenizer

from .base import EngineFacts, FaultUnsupported, LaunchContext, PrefixCacheResetUnsupported
from .configs import SglangEngineConfig, VllmEngineConfig
from .modeldir import SYNTH_PREFIX, resolve_model_ref
from .process import ManagedProcess, ProcessSpec

log = logging.getLogger(__name__)

LOG_FILE = "engine.log"
TOKENIZER_FILE = "tokenizer.json"
SESSION_TIMEOUT_S = 300.0


class EngineRequestError(KvbenchError):
    """An engine helper endpoint (/tokenize, /detokenize, prefix-cache reset) answered with an error."""


class TokenizerUnavailable(KvbenchError):
    """No exact tokenizer: the engine has no /tokenize endpoint and the model directory no tokenizer.json."""


# --- HTTP -------------------------------------------------------------------------------------


async def post_text(session: aiohttp.ClientSession, url: str, payload: object = None) -> tuple[int, str]:
    """POST (a JSON body unless ``payload`` is None); (status, body text). Transport failures: EngineRequestError.

    Only idempotent control calls come here (prefix-cache reset, tokenize, detokenize), so a POST
    that met a pooled connection the server had closed is sent once more on a new one
    (:func:`harness.client.connections.idempotent_request`): seen as ServerDisconnectedError on a
    vllm-router replica left idle (2026-11-26) and as ``ClientOSError: [Errno 32] Broken pipe`` on a
    long ``/tokenize`` to vLLM 0.26.0 (Llama-3.1-70B TP=4).
    """
    try:
        async with idempotent_request(session, "POST", url, json=payload) as response:
            return response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError) as error:
        raise EngineRequestError(f"POST {url} failed: {type(error).__name__}: {error}") from None


def _decode_body(text: str) -> object:
    """The JSON body, or the raw text when it is not JSON."""
    try:
        decoded: object = json.loads(text)
    except json.JSONDecodeError:
        return text
    return decoded


async def reset_with_retry(
    session: aiohttp.ClientSession,
    url: str,
    *,
    accepted: Callable[[int, str], bool | None],
    unsupported: Callable[[int], str],
    attempts: int = 1,
    retry_s: float = 0.0,
    refusal: str = "",
) -> None:
    """POST ``url`` (no body) until the engine accepts it.

    HTTP 404/405 raise :class:`PrefixCacheResetUnsupported` (message ``unsupported(status)``).
    ``accepted(status, text)`` says True (done), False (refused for now: retry after ``retry_s``,
    up to ``attempts`` times, then an EngineRequestError saying ``refusal`` with ``{attempts}``
    filled in) or None
    (an error answer: EngineRequestError at once).
    """
    text = ""
    for attempt in range(attempts):
        status, text = await post_text(session, url)
        if status in (404, 405):
            raise PrefixCacheResetUnsupported(unsupported(status))
        verdict = accepted(status, text)
        if verdict is None:
            raise EngineRequestError(f"POST {url}: HTTP {status}: {redact_text(text[:300])}")
        if verdict:
            return
        if attempt + 1 < attempts:
            await asyncio.sleep(retry_s)
    raise EngineRequestError(
        f"POST {url}: {refusal.format(attempts=attempts)}; last answer: {redact_text(' '.join(text.split())[:200])}"
    )


async def server_version(session: aiohttp.ClientSession, base_url: str) -> str:
    """``GET /version`` ({"version": ...}); "unknown" if the server does not say."""
    try:
        async with idempotent_request(session, "GET", base_url + "/version") as response:
            if response.status != 200:
                return "unknown"
            body = json.loads(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return "unknown"
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version else "unknown"


SIMULATOR_OWNER = "kvbench-sim"
"""``owned_by`` of every model ``kvbench sim serve`` lists under ``GET /v1/models``: how an attached endpoint is
known to be kvbench's simulator."""
SERVED_BY = "served_by"
"""The ``engines.ARM.details`` key an attached endpoint gets when it is kvbench's simulator (value
:data:`SIMULATOR_OWNER`); :func:`harness.results.provenance.provenance` reads it."""


async def served_by_simulator(session: aiohttp.ClientSession, base_url: str) -> bool:
    """Whether the server at ``base_url`` (no ``/v1``) lists its models as owned by kvbench's simulator."""
    try:
        async with idempotent_request(session, "GET", base_url + "/v1/models") as response:
            if response.status != 200:
                return False
            body = json.loads(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    models = body.get("data") if isinstance(body, dict) else None
    return isinstance(models, list) and any(
        isinstance(model, dict) and model.get("owned_by") == SIMULATOR_OWNER for model in models
    )


# --- tokenizers -------------------------------------------------------------------------------


class ModelDirTokenizer:
    """Exact token counts from a model directory's ``tokenizer.json`` (a Hugging Face fast tokenizer).

    This is the file the engines themselves load for fast tokenizers, read with the ``tokenizers``
    package, so the counts are the engine's. ``encode`` adds no special tokens (BOS): it counts the
    text itself, as a prompt builder needs.
    """

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self.path = path
        try:
            text = path.read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise TokenizerUnavailable(f"cannot read {path} as a tokenizer: {error}") from None
        self._tokenizer = HfTokenizer.from_str(text)

    @classmethod
    def from_model_dir(cls, model_dir: Path | None, why: str) -> ModelDirTokenizer:
        """The tokenizer of ``model_dir``; :class:`TokenizerUnavailable` (saying ``why``) if it has none."""
        path = model_dir / TOKENIZER_FILE if model_dir is not None else None
        if path is None or not path.is_file():
            where = (
                f"{model_dir} has no {TOKENIZER_FILE}"
                if model_dir is not None
                else "the model is not a local directory"
            )
            raise TokenizerUnavailable(
                f"{why}, and {where}. kvbench needs exact token counts (prompt lengths, cache hits): point "
                f"engine.model at a local model directory with a {TOKENIZER_FILE} (Hugging Face fast tokenizer)."
            )
        return cls(path)

    async def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    async def prompt_ids(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    async def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=False))


class ServerTokenizer:
    """Exact token counts from the server's own tokenizer (``POST /tokenize``, ``/detokenize``).

    ``encode`` adds no special tokens (BOS): it counts the text itself, as a prompt builder needs;
    the chat template adds what the model expects. ``/detokenize`` may answer ``{"prompt": ...}``
    (vLLM's shape) or ``{"text": ...}`` (SGLang's). With a ``fallback``, the first HTTP 404/405
    switches to ``fallback(path, status)`` for good; without one it is an error like any other.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        model: str,
        *,
        fallback: Callable[[str, int], Tokenizer] | None = None,
    ) -> None:
        self._session = session
        self._base_url = base_url
        self._model = model
        self._fallback = fallback
        self._local: Tokenizer | None = None

    @property
    def uses_endpoint(self) -> bool:
        """False once the server turned out to have no /tokenize (and the fallback took over)."""
        return self._local is None

    async def _post(self, path: str, payload: object) -> tuple[Tokenizer | None, object]:
        """(the fallback tokenizer, None) after a 404/405 with a fallback, else (None, the JSON answer)."""
        url = self._base_url + path
        status, text = await post_text(self._session, url, payload)
        if status in (404, 405) and self._fallback is not None:
            self._local = self._fallback(path, status)
            return self._local, None
        if status != 200:
            raise EngineRequestError(f"POST {url}: HTTP {status}: {redact_text(text[:300])}")
        return None, _decode_body(text)

    async def encode(self, text: str) -> list[int]:
        return await self._tokenize(text, special_tokens=False)

    async def prompt_ids(self, text: str) -> list[int]:
        return await self._tokenize(text, special_tokens=True)

    async def _tokenize(self, text: str, *, special_tokens: bool) -> list[int]:
        body: object = None
        if self._local is None:
            payload = {"model": self._model, "prompt": text, "add_special_tokens": special_tokens}
            _, body = await self._post("/tokenize", payload)
        if self._local is not None:  # the server has no /tokenize: its fallback (set by _post on a 404/405)
            return await (self._local.prompt_ids(text) if special_tokens else self._local.encode(text))
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineRequestError(
                f"POST {self._base_url}/tokenize answered without a token list: {redact_text(str(body)[:200])}"
            )
        return [int(token) for token in tokens]

    async def decode(self, token_ids: Sequence[int]) -> str:
        if self._local is not None:
            return await self._local.decode(token_ids)
        local, body = await self._post("/detokenize", {"model": self._model, "tokens": list(token_ids)})
        if local is not None:
            return await local.decode(token_ids)
        text: object = None
        if isinstance(body, dict):
            text = body["text"] if "text" in body else body.get("prompt")
        if not isinstance(text, str):
            raise EngineRequestError(
                f"POST {self._base_url}/detokenize answered without text: {redact_text(str(body)[:200])}"
            )
        return text


# --- running engines --------------------------------------------------------------------------


class RunningServer:
    """The endpoint and facts of a :class:`~harness.engines.base.RunningEngine`."""

    def __init__(self, endpoint: Endpoint, facts: EngineFacts) -> None:
        self._endpoint = endpoint
        self._facts = facts

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    @property
    def facts(self) -> EngineFacts:
        return self._facts


class RunningProcess(RunningServer):
    """A :class:`RunningServer` that kvbench started: its pid and log tail come from the process.

    It is a :class:`~harness.engines.base.FaultTarget` (soak fault drills), for every kind at once:
    the engine process, and the tier-server sidecars a kind names in :meth:`tier_processes`.
    """

    def __init__(self, endpoint: Endpoint, facts: EngineFacts, process: ManagedProcess) -> None:
        super().__init__(endpoint, facts)
        self._process = process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def exit_code(self) -> int | None:
        return self._process.returncode()

    def tier_processes(self) -> tuple[ManagedProcess, ...]:
        """The offload-tier servers kvbench runs beside the engine (none unless a kind says so)."""
        return ()

    def has_tier_server(self) -> bool:
        return bool(self.tier_processes())

    async def kill_engine(self) -> float:
        return await self._process.kill_and_restart()

    async def pause_engine(self, seconds: float) -> None:
        self._process.pause()
        try:
            await asyncio.sleep(seconds)
        finally:
            self._process.resume()

    async def restart_tier(self) -> float:
        tiers = self.tier_processes()
        if not tiers:
            raise FaultUnsupported(
                f"{self._facts.kind} engine has no offload-tier server beside it (restart_tier needs one, "
                "e.g. vLLM with offload backend lmcache-mp)"
            )
        return sum([await tier.kill_and_restart() for tier in tiers])

    def log_tail(self, lines: int = 50) -> list[str]:
        return self._process.log_tail(lines)


RunningT = TypeVar("RunningT")
ConfigT = TypeVar("ConfigT")


def engine_config(config: object, expected: type[ConfigT], engine: str) -> ConfigT:
    """``config`` as the config class an engine kind takes (TypeError naming both when a caller passes another)."""
    if not isinstance(config, expected):
        article = "an" if expected.__name__[:1] in "AEIOU" else "a"
        raise TypeError(f"{engine} needs {article} {expected.__name__}, got {type(config).__name__}")
    return config


class ProcessEngine(Generic[ConfigT, RunningT]):
    """The ``async with`` lifecycle of an engine kvbench starts, on a config of its kind (``expected``) whose offload
    profile ``check`` accepts (it raises ValueError otherwise).

    Entering runs :meth:`_start` with a fresh exit stack (what it enters is left in reverse order);
    a failed start, and leaving, close the stack and remove ``self._workdir`` if ``_start`` made one.
    """

    def __init__(
        self,
        config: object,
        context: LaunchContext,
        expected: type[ConfigT],
        check: Callable[[OffloadProfile, ConfigT], None],
    ) -> None:
        self.config = engine_config(config, expected, type(self).__name__)
        check(context.profile, self.config)
        self.context = context
        self._stack: contextlib.AsyncExitStack | None = None
        self._workdir: Path | None = None

    @property
    def log_path(self) -> Path:
        return self.context.log_dir / LOG_FILE

    async def _start(self, stack: contextlib.AsyncExitStack) -> RunningT:
        raise NotImplementedError

    async def __aenter__(self) -> RunningT:
        if self._stack is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        stack = contextlib.AsyncExitStack()
        self._stack = stack
        try:
            return await self._start(stack)
        except BaseException:
            await self._close()
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        stack, self._stack = self._stack, None
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None


class _ServerLimits(Protocol):
    @property
    def startup_timeout_s(self) -> float: ...

    @property
    def stop_grace_s(self) -> float: ...


async def start_server(stack: contextlib.AsyncExitStack, process: ManagedProcess) -> ManagedProcess:
    """Start ``process`` (a :func:`server_process`) on ``stack``: it returns once ``GET base_url/health`` answers."""
    await stack.enter_async_context(process)
    return process


def server_process(
    *,
    name: str,
    argv: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    base_url: str,
    config: _ServerLimits,
    cleanup_globs: tuple[str, ...] = (),
) -> ManagedProcess:
    """A server's :class:`ManagedProcess`, not started yet (:func:`start_server`, or a caller's own start)."""
    return ManagedProcess(
        ProcessSpec(
            name=name,
            argv=tuple(argv),
            env=env,
            log_path=log_path,
            health_url=base_url + "/health",
            startup_timeout_s=config.startup_timeout_s,
            stop_grace_s=config.stop_grace_s,
            cleanup_globs=cleanup_globs,
        )
    )


def open_session(stack: contextlib.AsyncExitStack) -> aiohttp.ClientSession:
    """An HTTP session for the engine's helper endpoints (no connection idle > 3 s reused), closed with ``stack``."""
    session = new_session(timeout=aiohttp.ClientTimeout(total=SESSION_TIMEOUT_S))
    stack.push_async_callback(session.close)
    return session


# --- launch steps -----------------------------------------------------------------------------


class _NamedModel(Protocol):
    @property
    def model(self) -> str: ...

    @property
    def served_model_name(self) -> str | None: ...


def served_model_name(config: _NamedModel) -> str:
    """``config.served_model_name``, else a ``synth:`` shape, else the model directory's name."""
    if config.served_model_name:
        return config.served_model_name
    if config.model.startswith(SYNTH_PREFIX):
        return config.model.removeprefix(SYNTH_PREFIX)
    return Path(config.model).name or config.model


class _ServedModel(_NamedModel, Protocol):
    @property
    def host(self) -> str: ...


def serving_args(config: _ServedModel, port: int) -> list[str]:
    """The server flags vLLM and SGLang share: the model name it answers to, the address it listens on."""
    return ["--served-model-name", served_model_name(config), "--host", config.host, "--port", str(port)]


def value_flags(*flags: tuple[str, object | None]) -> list[str]:
    """``flag value`` for each flag whose value is set, in order (None: left out, the engine's default)."""
    return [part for flag, value in flags if value is not None for part in (flag, str(value))]


NamedConfigT = TypeVar("NamedConfigT", VllmEngineConfig, SglangEngineConfig)


async def resolve_served_model(config: NamedConfigT) -> tuple[Path, NamedConfigT]:
    """(the model directory, ``config`` naming it as ``model`` with its served name pinned).

    ``synth:SHAPE`` names a hub-free model directory that kvbench builds (once) for dummy weights.
    """
    model_dir = await asyncio.to_thread(resolve_model_ref, config.model)
    update = {"model": str(model_dir), "served_model_name": served_model_name(config)}
    return model_dir, config.model_copy(update=update)


async def prepare_served(
    config: NamedConfigT, log_dir: Path, python_of: Callable[[NamedConfigT], str]
) -> tuple[Path, NamedConfigT, str]:
    """An engine's first steps on a model directory: (the directory, ``config`` naming it as
    :func:`resolve_served_model` makes it, the engine's python by ``python_of``), with the arm's ``log_dir`` made."""
    model_dir, config = await resolve_served_model(config)
    python = python_of(config)
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    return model_dir, config, python


def resolve_python(configured: str | None, env_var: str) -> str:
    """The engine's python: the configured one, else ``$env_var``, else kvbench's own."""
    return configured or os.environ.get(env_var) or sys.executable


def parallelism_text(tp: int, pp: int, dp: int | None = None) -> str:
    """How the manifest records parallelism: ``tp=1 pp=1 dp=1`` (``dp`` left out when None)."""
    text = f"tp={tp} pp={pp}"
    return text if dp is None else f"{text} dp={dp}"


def marked_value(stdout: str, marker: str) -> str | None:
    """What follows ``marker`` on the last line of ``stdout`` that starts with it (None: no such line)."""
    line = next((line for line in reversed(stdout.splitlines()) if line.startswith(marker)), None)
    return None if line is None else line.removeprefix(marker)


async def probe_python(
    python: str, script: str, marker: str, *, what: str, timeout_s: float, hint: Callable[[str, str], str]
) -> str:
    """Run ``python -c script``; what follows ``marker`` on the last stdout line that starts with it.

    EngineStartError (worded by ``hint(python, problem)``) if ``python`` cannot run, takes longer
    than ``timeout_s`` or prints no such line (then with the tail of its stderr); ``what`` names
    the step in those messages (``'import vllm'``).
    """
    # a worker thread rather than an asyncio subprocess: its transport cannot outlive the event loop
    # (an interrupted run otherwise ends with "Event loop is closed" noise from the transport's __del__)
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [python, "-c", script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except OSError as error:
        raise EngineStartError(hint(python, f"cannot run {python!r}: {error}")) from None
    except subprocess.TimeoutExpired:
        raise EngineStartError(hint(python, f"{what} took more than {timeout_s:.0f} s")) from None
    stdout, stderr = done.stdout, done.stderr
    value = marked_value(stdout.decode("utf-8", errors="replace"), marker)
    if value is not None:
        return value
    tail = [redact_text(line) for line in stderr.decode("utf-8", errors="replace").splitlines()[-15:]]
    detail = "\n".join(f"    {line}" for line in tail)
    raise EngineStartError(hint(python, f"{what} failed (exit code {done.returncode}):\n{detail}"))


def make_offload_dirs(must_exist: Sequence[Path], dirs: Sequence[Path]) -> None:
    """Check the shared tier directories that must exist; create the others. EngineStartError if not."""
    for path in must_exist:
        if not path.is_dir():
            raise EngineStartError(f"offload tier directory {path} does not exist (a shared mount is expected)")
    for path in dirs:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise EngineStartError(f"cannot create offload directory {path}: {error.strerror}") from None


def remove_session_dirs(profile: OffloadProfile, session: str) -> tuple[Path, ...]:
    """Remove ``<path>/<session>`` under every tier path the engine session was scoped to
    (:func:`offload.profiles.session_dirs`), with the KV its engines wrote there; return what was removed.

    Call it after the session's engines stopped. Nothing else under a user's path is touched: not the
    base, not a symlink that happens to carry the session's name. A failure is logged, not raised (the
    run's records are what matter, and the next session writes to a directory of another name).
    """
    removed: list[Path] = []
    for pure in session_dirs(profile, session):
        path = Path(pure)
        if path.is_symlink() or not path.is_dir():
            continue  # never created (an engine kind without tier paths, a failed start), or not ours
        try:
            shutil.rmtree(path)
        except OSError as error:
            log.warning("cannot remove the engine session's tier directory %s: %s", path, error.strerror or error)
            continue
        removed.append(path)
    return tuple(removed)
