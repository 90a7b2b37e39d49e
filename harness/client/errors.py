"""How a request can fail, as the client classifies it (stored in each record's ``error_kind``)."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "http_status",
    "server_error",
    "timeout",
    "connection",
    "malformed_frame",
    "stream_dropped",
    "empty_response",
]
