"""Where the client sends requests: base URL, model name, API key (never in ``repr``), metrics path."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Endpoint:
    """Where requests go. The API key never appears in ``repr``."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    metrics_path: str = "/metrics"
    """Where the engine serves Prometheus text (TensorRT-LLM: /prometheus/metrics)."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
