"""`laya serve`: load the models named on the command line and serve them with uvicorn."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from laya.server.app import ServerConfig, create_app

CONFIG_ENV = "LAYA_SERVE_CONFIG"
# Longer than most clients' pool idle time: a server closing an idle keep-alive connection while a
# client reuses it makes that request fail at the connection level.
KEEP_ALIVE_S = 65
BACKLOG = 2048
log = logging.getLogger("laya.server")


@dataclass
class ModelSpec:
    """`--model [NAME=]PATH_OR_ID`."""

    source: str
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        name, sep, source = text.partition("=")
        if sep and name and "/" not in name and os.sep not in name:
            return cls(source=source, name=name)
        return cls(source=text)


@dataclass
class ServeOptions:
    models: list[ModelSpec] = field(default_factory=list)
    runtime: str = "torch"
    threads: int | None = None
    server: ServerConfig = field(default_factory=ServerConfig)


def load_engines(options: ServeOptions) -> list[Any]:
    """Every model as an engine; the first is the default. Raises on the first one that fails."""
    import laya
    from laya.engines import EncoderEngine
    from laya.models.registry import lookup

    engines = []
    specs = options.models or [ModelSpec("laya-multilingual")]
    for spec in specs:
        runtime_options = {"threads": options.threads} if options.threads else {}
        model = laya.load(spec.source, runtime=options.runtime, name=spec.name, local_only=not options.models,
                          **runtime_options)
        entry = lookup(spec.source)
        description = entry.description if entry else f"laya checkpoint {spec.source}"
        engines.append(EncoderEngine(model, description=description))
        log.info("loaded %s from %s on %s", model.name, spec.source, model.runtime.name)
    return engines


def build_app(options: ServeOptions):
    return create_app(lambda: load_engines(options), options.server)


def app_from_env():
    """Factory for multi-worker uvicorn: each worker process rebuilds the app from the environment."""
    raw = json.loads(os.environ[CONFIG_ENV])
    options = ServeOptions(models=[ModelSpec(**m) for m in raw["models"]], runtime=raw["runtime"],
                           threads=raw["threads"], server=ServerConfig(**raw["server"]))
    return build_app(options)


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("laya")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def serve(options: ServeOptions, host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    import uvicorn

    configure_logging()
    if workers > 1:
        os.environ[CONFIG_ENV] = json.dumps({"models": [asdict(m) for m in options.models], "runtime": options.runtime,
                                             "threads": options.threads, "server": asdict(options.server)})
        uvicorn.run("laya.server.serve:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level="warning", timeout_keep_alive=KEEP_ALIVE_S, backlog=BACKLOG)
    else:
        uvicorn.run(build_app(options), host=host, port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S,
                    backlog=BACKLOG)
