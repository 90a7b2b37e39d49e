"""``GET /v1/models``: the models an OpenAI-compatible server serves (its ``data[].id``), for a run that names none.

The answer is ``{"object": "list", "data": [{"id": NAME, ...}, ...]}`` (OpenAI's shape; vLLM, SGLang,
TensorRT-LLM, llama.cpp and the simulator all answer it). :func:`served_models` raises
:class:`ModelListError` with one line naming the URL and what went wrong.
"""

from __future__ import annotations

import json

import aiohttp

from common.errors import KvbenchError
from common.redact import redact_text

from .connections import idempotent_request


class ModelListError(KvbenchError):
    """``GET /v1/models`` failed or did not answer a model list."""


async def served_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """The ids the server at ``base_url`` (no ``/v1``) lists under ``GET /v1/models``, in its order."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with idempotent_request(session, "GET", url) as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as error:
        raise ModelListError(f"GET {redact_text(url)} failed: {type(error).__name__}: {error}") from None
    if status != 200:
        raise ModelListError(f"GET {redact_text(url)}: HTTP {status}: {redact_text(' '.join(text.split())[:200])}")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    data = body.get("data") if isinstance(body, dict) else None
    ids = [item.get("id") for item in data if isinstance(item, dict)] if isinstance(data, list) else None
    if ids is None or not all(isinstance(model, str) and model for model in ids):
        raise ModelListError(
            f"GET {redact_text(url)} answered no model list ({{'data': [{{'id': ...}}]}}): {redact_text(text[:200])}"
        )
    return [str(model) for model in ids]
