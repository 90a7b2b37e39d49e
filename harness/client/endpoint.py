"""Where the client sends requests: base URL, model name, API key (never in ``repr``), metrics path."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.redact import remember_secret


@dataclass(frozen=True)
class Endpoint:
    """Where requests go. The API key never appears in ``repr``."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    metrics_path: str = "/metrics"
    """Where the engine serves Prometheus text (TensorRT-LLM: /prometheus/metrics)."""

    def __post_init__(self) -> None:
        remember_secret(self.api_key)  # never printed or stored, whatever a server echoes it with

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
