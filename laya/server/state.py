"""What the server's parts share: its configuration, what it has loaded, and a request's deadline."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from laya.api import ApiError, usage_error
from laya.engine import AnyEngine
from laya.limits import Limits
from laya.server.batcher import MicroBatcher
from laya.server.batching import Batching

log = logging.getLogger("laya.server")
# A client may ask for a shorter deadline than the server's --request-timeout-s (seconds, > 0).
TIMEOUT_HEADER = "x-laya-timeout-s"

@dataclass
class ServerConfig:
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    max_wait_ms: float = 0.0  # 0: an idle engine starts at once; what queued while it ran batches
    max_batch_rows: int = 64
    max_batch_tokens: int | None = None  # a forward batch's token budget too (a GPU's pass), None: rows only
    max_pending_rows: int = 512  # rows waiting or running per model before 429
    max_concurrency: int = 64  # decision requests inside the server at once; more are shed at the door
    # Shed at the door while the work inside would take longer than this to drain (None: no bound of
    # its own; a request is shed when the queue cannot drain within its deadline).
    max_queue_ms: float | None = None
    request_timeout_s: float = 30.0  # a request's deadline; a client may ask for less (TIMEOUT_HEADER)
    # the deadline is at least the time the request's work may take at the model's measured speed
    # (`laya.server.work`); False: `request_timeout_s` for every request (`laya serve --fixed-deadline`)
    deadline_follows_work: bool = True
    drain_s: float = 30.0  # on SIGTERM/SIGINT: how long what is in flight may take to finish
    shed_hold_ms: float = 1000.0  # how long a shed 429 is held before it is sent (at most its Retry-After)
    # With engines in processes of their own: the HTTP loop yields the CPU to them under contention.
    http_nice: int = 0
    retry_after_s: int = 1
    limits: Limits = field(default_factory=Limits)
    # With no API key on a loopback bind, only loopback Host names are served (no DNS rebinding).
    loopback_only: bool = True
    # With an API key: /metrics, and the docs with the OpenAPI document, answer without it only if public
    public_metrics: bool = False
    public_docs: bool = False
    # Answers and errors with the System One contract's fields only, no `x_` extension (a request's
    # `X-Laya-Strict` header decides for itself)
    strict: bool = False
    # `x_order` of a request that does not say (`laya serve --order`): as_given, both or rotate:K
    order: str = "as_given"

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):  # rebuilt from JSON in worker processes
            self.limits = Limits(**self.limits)

    @property
    def batching(self) -> Batching:
        """The batching policy (`--max-batch-rows`, `--max-batch-tokens`, `--max-wait-ms`) every mode applies."""
        return Batching(max_rows=self.max_batch_rows, max_wait_ms=self.max_wait_ms, max_tokens=self.max_batch_tokens)


@dataclass
class Served:
    """What the server has loaded; filled by a background thread so /ready can say 503 meanwhile."""

    engines: dict[str, AnyEngine] = field(default_factory=dict)
    batchers: dict[str, MicroBatcher] = field(default_factory=dict)
    default: str | None = None
    ready: bool = False
    load_errors: list[str] = field(default_factory=list)
    draining_since: float | None = None  # monotonic time SIGTERM/SIGINT began the drain
    started_at: float = field(default_factory=time.time)  # when the server started (OpenAI's model `created`)

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def begin_drain(self) -> None:
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            log.info("draining: new decision requests get 503, what is in flight finishes")

    def unready(self) -> dict[str, dict[str, Any]]:
        """The models that cannot answer now (an engine process restarting or down), by name."""
        out = {}
        for name, engine in self.engines.items():
            status = engine.status()
            if status.get("state") != "ready":
                out[name] = status
        return out


def request_timeout(raw: str | None, config: ServerConfig) -> tuple[float, str | None]:
    """A request's time budget in seconds and, if the client's header is unusable, why. The header
    may only shorten the server's bound."""
    if raw is None:
        return config.request_timeout_s, None
    try:
        asked = float(raw)
    except ValueError:
        asked = math.nan
    if not math.isfinite(asked) or asked <= 0:
        return config.request_timeout_s, (f"the {TIMEOUT_HEADER} header must be a positive number of seconds, "
                                          f"not {raw[:40]!r}")
    return min(asked, config.request_timeout_s), None


def timeout_error(budget_s: float, config: ServerConfig, work: str = "") -> ApiError:
    """The 504 of a request past its deadline, naming what set it: the client's header, the server's
    --request-timeout-s, or the work the request asked for (`work`: that work, in its own units)."""
    which = (f"its {TIMEOUT_HEADER} header" if budget_s < config.request_timeout_s
             else f"the time its work may take at this model's measured speed, {work}, over the server's "
                  f"--request-timeout-s of {config.request_timeout_s:g} s" if work
             else "the server's --request-timeout-s")
    return usage_error(504, "timeout_error", f"the request was not answered within its deadline of {budget_s:g} s "
                                             f"({which}); its remaining work was stopped")
