"""HTTP redirects on the way to an endpoint: followed only within its origin, and remembered.

An origin is (scheme, host, port), RFC 6454. A server that answers 301/302/303/307/308 with a
``Location`` on another origin would have kvbench time that other host and report its TTFT as the
endpoint's (and send it the API key), so every session :func:`harness.client.connections.new_session`
opens refuses such a redirect before it is followed: the request fails with
:class:`CrossOriginRedirect`, whose one-line message names both URLs. A redirect within the origin
(``/v1/models`` -> ``/v1/models/``) is followed, as aiohttp does by default, and kept in
:data:`SEEN` (from URL -> to URL, each pair once) so a run can name the URLs it really measured: the
manifest's ``engines.ARM.details.redirected`` (:func:`followed_under`).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import aiohttp
from yarl import URL

from common.redact import redact_text

log = logging.getLogger(__name__)

SEEN: dict[str, str] = {}
"""Same-origin redirects followed in this process: from URL -> the URL it was redirected to."""


class CrossOriginRedirect(aiohttp.ClientError):
    """The server redirected a request to another origin; the message names both URLs."""


def origin(url: URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    return (url.scheme.lower(), (url.host or "").lower(), url.port)


def redirect_target(url: URL, location: str) -> URL:
    """Where ``Location: location`` sends a request to ``url`` (a relative location is on ``url``'s origin)."""
    return url.join(URL(location))


def describe_redirect(url: URL, target: URL, status: int) -> str:
    return (
        f"{redact_text(str(url))} redirected (HTTP {status}) to {redact_text(str(target))}, another origin "
        "(scheme, host, port): refused, kvbench measures only the endpoint it was given; give the final URL instead"
    )


async def _on_redirect(
    _session: aiohttp.ClientSession, _context: SimpleNamespace, params: aiohttp.TraceRequestRedirectParams
) -> None:
    response = params.response
    location = response.headers.get("Location") or response.headers.get("URI") or ""
    target = redirect_target(params.url, location)
    if origin(target) != origin(params.url):
        response.close()
        raise CrossOriginRedirect(describe_redirect(params.url, target, response.status))
    source = str(params.url.with_query(None).with_fragment(None))
    if source not in SEEN:
        SEEN[source] = str(target)
        log.warning("%s redirected (HTTP %d) to %s (same origin): followed", source, response.status, target)


def followed_under(root: str) -> str | None:
    """The same-origin redirects followed from URLs under ``root``, as "FROM -> TO; ..." (None: none)."""
    pairs = [f"{source} -> {target}" for source, target in SEEN.items() if source.startswith(root.rstrip("/"))]
    return "; ".join(pairs) or None


def redirect_trace() -> aiohttp.TraceConfig:
    """The trace config that applies this module's rule to every request of a session."""
    config = aiohttp.TraceConfig()
    config.on_request_redirect.append(_on_redirect)
    return config
