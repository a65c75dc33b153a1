"""laya on Ray Serve: the same /v1/systemone application as `laya serve`, its models as deployments.

The ingress deployment runs the one FastAPI app (`create_app`): routes, validation, errors, auth,
compression, admission and metrics are the same code as `laya serve`'s. Each served model is a
deployment of its own (`ModelReplica`) with its own replicas or autoscaling: a replica loads the
model as `laya serve` does (`load_engine`) and runs what it is sent through the same MicroBatcher,
so requests that meet in a replica share forward passes and are answered bit for bit as if alone.

The ingress reaches a model through `RayEngine`, the engine shape over a deployment handle: a job
goes whole to one replica (prepared and run there, so the ingress never loads a model). A replica
that dies under a job is retried once on another, since an answer is a pure function of its
request; with no replica able to answer in time the request gets a 503 with `Retry-After`.

Started by `laya serve --ray` (`run`) or by Ray's own tooling: `serve run deploy/ray-serve.yaml`
(`build` is the YAML's `import_path`). This module is the only one that imports ray.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from laya.engine import EngineInfo, Timing
from laya.errors import LayaError
from laya.limits import Limits
from laya.request import Request
from laya.response import SystemOneResponse
from laya.server import heap
from laya.server.app import ServerConfig, create_app
from laya.server.batcher import MicroBatcher, Unavailable
from laya.server.batching import Batching
from laya.server.engine_loop import portable
from laya.server.serve import KEEP_ALIVE_S, ModelSpec, ServeOptions, configure_logging, load_engine
from laya.stop import StopFlag, after

log = logging.getLogger("laya.server")
APP_NAME = "laya"
INGRESS = "laya-ingress"
API_KEY_ENV = "LAYA_API_KEY"  # the ingress reads the key from its environment when the config has none


@dataclass
class ModelConfig:
    """One served model: what `laya serve --model` takes, and its Serve options."""

    source: str
    name: str | None = None
    runtime: str | None = None  # laya checkpoints: auto unless named; a .gguf goes to the decide engine
    precision: str | None = None  # the runtime's precision (with auto: "fp32" keeps it exact)
    threads: int = 1  # CPU threads per replica (also the CPUs a replica reserves, unless num_cpus says)
    calibration: str | None = None
    compact: bool = False
    n_ctx: int | None = None  # a GGUF's context (None: its trained one, as memory allows)
    prefix_cache: str = "auto"
    readout: str | None = None  # a GGUF's readout profile (None: what its metadata names)
    num_replicas: int = 1
    autoscaling: dict[str, Any] | None = None  # Serve's autoscaling_config (scales on ongoing requests)
    max_ongoing_requests: int = 32  # per replica; more wait in the ingress's router
    num_cpus: float | None = None
    max_wait_ms: float = 0.0  # how long a batch waits for company inside a replica (0: it never waits idle)
    max_batch_rows: int = 64
    max_batch_tokens: int | None = None  # a batch's token budget too (a GPU's pass), None: rows only

    @property
    def batching(self) -> Batching:
        """The batching policy inside a replica: the same three settings as `laya serve`'s."""
        return Batching(max_rows=self.max_batch_rows, max_wait_ms=self.max_wait_ms, max_tokens=self.max_batch_tokens)

    @property
    def deployment(self) -> str:
        """The deployment's name (what a YAML's `deployments:` entries name): the model's name, or a
        slug of its source."""
        base = self.name or Path(self.source.rstrip("/")).name.removesuffix(".gguf") or "model"
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", base)[:64]

    def serve_options(self) -> ServeOptions:
        return ServeOptions(runtime=self.runtime, precision=self.precision, threads=self.threads, n_ctx=self.n_ctx,
                            prefix_cache=self.prefix_cache, compact=self.compact, engine_process=False,
                            calibration={"": self.calibration} if self.calibration else {})

    def spec(self) -> ModelSpec:
        return ModelSpec(source=self.source, name=self.name, readout=self.readout)


@dataclass
class RayAppConfig:
    """The whole application; `build(args)` reads it from a Serve YAML's `args`."""

    models: list[ModelConfig]
    server: ServerConfig = field(default_factory=ServerConfig)
    ingress_replicas: int = 1
    replica_wait_s: float = 60.0  # longest a request waits on the replicas before its 503

    def cpus_needed(self) -> int:
        """The CPUs every replica at its most reserves: a local cluster started for this app has at least
        these (Ray would otherwise leave replicas pending on a machine with fewer cores)."""
        total = 0.0
        for m in self.models:
            most = (m.autoscaling or {}).get("max_replicas", m.num_replicas)
            total += most * (m.num_cpus if m.num_cpus is not None else m.threads)
        return math.ceil(total)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> RayAppConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(args) - known
        if unknown:
            raise LayaError(f"unknown laya Ray Serve settings {sorted(unknown)}; known: {sorted(known)}")
        models = args.get("models")
        if not models or not isinstance(models, list):
            raise LayaError("the laya Ray Serve config needs `models`: a list of {source, name, runtime, ...}")
        model_fields = {f.name for f in fields(ModelConfig)}
        parsed = []
        for m in models:
            m = {"source": m} if isinstance(m, str) else dict(m)
            bad = set(m) - model_fields
            if bad or "source" not in m:
                raise LayaError(f"model entry {m!r}: needs `source`; unknown keys {sorted(bad)}; "
                                f"known: {sorted(model_fields)}")
            parsed.append(ModelConfig(**m))
        server = dict(args.get("server") or {})
        if isinstance(server.get("limits"), dict):
            server["limits"] = Limits(**server["limits"])
        return cls(models=parsed, server=ServerConfig(**server),
                   **{k: args[k] for k in ("ingress_replicas", "replica_wait_s") if k in args})


# ---------------------------------------------------------------------------------------------- replicas


# Serve's own line per call is off: the ingress writes laya's access line (one per HTTP request).
QUIET = {"enable_access_log": False}


@serve.deployment(max_ongoing_requests=32, health_check_period_s=5, health_check_timeout_s=30,
                  graceful_shutdown_timeout_s=60, logging_config=QUIET)
class ModelReplica:
    """One replica of one served model. Ready (constructed) once the model is loaded and warmed up,
    which is what `/ready` means; healthy while its batcher runs."""

    def __init__(self, model: ModelConfig):
        configure_logging()
        self.engine = load_engine(model.spec(), model.serve_options())
        self.engine.warmup()
        heap.freeze_loaded()  # a replica's process lives for its engine: nothing is thawed
        self.model = model
        self.answered = 0
        self._batcher: MicroBatcher | None = None

    def _started(self) -> MicroBatcher:
        """The batcher, started on the first call (it lives on the replica's event loop). It never
        refuses: Serve bounds what reaches a replica (`max_ongoing_requests`), the ingress the rest."""
        if self._batcher is None:
            self._batcher = MicroBatcher(self.engine, batching=self.model.batching, max_pending_rows=2**62)
            self._batcher.start()
        return self._batcher

    def describe(self) -> tuple[EngineInfo, dict[str, Any]]:
        return self.engine.info, self.engine.describe()

    def stats(self) -> dict[str, Any]:
        """Which process this replica is and how many requests it answered (tests, operators)."""
        return {"pid": os.getpid(), "answered": self.answered}

    async def answer(self, request: Request, limits: Limits, seconds_left: float | None = None) -> tuple:
        """`("ok", results, timing)` or `("error", exception)`: a refusal travels back as a value, with
        its type and fields, rather than wrapped in Ray's task error. Past `seconds_left` the job stops
        between forward passes here, as in `laya serve`."""
        try:
            job = await asyncio.to_thread(self.engine.prepare, request, limits=limits, deadline=after(seconds_left))
        except Exception as exc:  # noqa: BLE001 - a refusal (or a failure) goes back to the ingress
            return ("error", portable(exc))
        batcher = self._started()
        rows = job.n_rows
        batcher.reserve(rows)
        try:
            results, timing = await batcher.submit(job, rows)
        except asyncio.CancelledError:  # the caller went away: its remaining forward passes are skipped
            job.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001
            return ("error", portable(exc))
        self.answered += 1
        return ("ok", results, asdict(timing))

    async def plan(self, request: Request, limits: Limits) -> tuple:
        """`("ok", plan)` or `("error", exception)`, as `answer`: the request prepared here, not run."""
        try:
            return ("ok", await asyncio.to_thread(self.engine.plan, request, limits=limits))
        except Exception as exc:  # noqa: BLE001
            return ("error", portable(exc))

    def check_health(self) -> None:
        task = self._batcher._task if self._batcher is not None else None
        if task is not None and task.done():
            raise RuntimeError(f"the batcher of {self.engine.info.name} stopped")


# ------------------------------------------------------------------------------------------------ ingress


@dataclass
class RayJob:
    """A request for one model, sent whole to a replica (prepared and run there)."""

    request: Request
    limits: Limits
    cancelled: StopFlag = field(default_factory=StopFlag)

    @property
    def n_rows(self) -> int:
        return self.request.rows


class RayEngine:
    """The engine shape over a model deployment, a `ForwardingEngine`: the app sends each job on at once
    (`submit`) instead of batching here, so the replicas work side by side."""

    def __init__(self, handle: DeploymentHandle, info: tuple[EngineInfo, dict[str, Any]], deployment: str, *,
                 wait_s: float, retry_after_s: int):
        self.handle, self.deployment = handle, deployment
        self.info, self._describe = info
        self.wait_s, self.retry_after_s = wait_s, retry_after_s

    @classmethod
    async def connect(cls, handle: DeploymentHandle, deployment: str, *, wait_s: float,
                      retry_after_s: int) -> RayEngine:
        info = await handle.describe.remote()
        return cls(handle, info, deployment, wait_s=wait_s, retry_after_s=retry_after_s)

    def prepare(self, request: Request, *, limits: Limits, deadline: float | None = None) -> RayJob:
        """(Prepared and counted against the limits in the replica, as `laya serve` does in its engine.)"""
        return RayJob(request, limits, cancelled=StopFlag(deadline))

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """(Ray's handles bring their replies to whichever loop awaits them.)"""

    def plan(self, request: Request, *, limits: Limits) -> dict[str, Any]:
        """A replica's plan of the request. Blocking (the app calls it on a worker thread); none
        answering within `wait_s`: `Unavailable`."""
        try:
            reply = self.handle.plan.remote(request, limits).result(timeout_s=self.wait_s)
        except TimeoutError:
            raise self._late("planned the request") from None
        except RayActorError:
            raise self._gone() from None
        return _answered(reply)[0]

    def warmup(self) -> None:
        """Each replica warmed up before it took traffic."""

    def describe(self) -> dict[str, Any]:
        return {**self._describe, "ray": {"deployment": self.deployment, "app": APP_NAME}}

    def status(self) -> dict[str, Any]:
        """Serve keeps the replicas (health checks, restarts); a request finding none gets its 503."""
        return {"state": "ready"}

    def close(self) -> None:
        """The replicas are Serve's to stop."""

    async def submit(self, job: RayJob) -> tuple[list[SystemOneResponse], Timing]:
        """The job's answers from one replica. A replica that dies (or cannot be reached) under it:
        once more, on another replica (Serve's router drops a dead replica at once). None answering
        within `wait_s`: `Unavailable` (a 503 with Retry-After), never a hang."""
        deadline = time.monotonic() + self.wait_s
        for attempt in (1, 2):
            # the request's own deadline crosses as the seconds it has left (another host's clock is not ours)
            response = self.handle.answer.remote(job.request, job.limits, job.cancelled.remaining())
            try:
                reply = await asyncio.wait_for(_result(response), max(0.1, deadline - time.monotonic()))
            except asyncio.CancelledError:
                response.cancel()
                raise
            except TimeoutError:
                response.cancel()
                raise self._late("answered") from None
            except RayActorError as exc:
                log.warning("a replica of %s died under a request (attempt %d): %s", self.info.name, attempt,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
            results, timing = _answered(reply)
            return results, Timing(**timing)
        raise self._gone()

    def _late(self, did: str) -> Unavailable:
        """No replica did it within `wait_s`: the 503 with Retry-After, never a hang."""
        return Unavailable(f"no replica of {self.info.name} {did} within {self.wait_s:g} s", self.retry_after_s)

    def _gone(self) -> Unavailable:
        return Unavailable(f"the replicas of {self.info.name} went away under the request", self.retry_after_s)


def _answered(reply: tuple[Any, ...]) -> tuple[Any, ...]:
    """A replica's reply is ("error", refusal) or ("ok", *what it answered)."""
    if reply[0] == "error":
        raise reply[1]
    return reply[1:]


async def _result(response: Any) -> Any:
    return await response


@serve.deployment(name=INGRESS, ray_actor_options={"num_cpus": 0}, health_check_period_s=5, logging_config=QUIET)
@serve.ingress()
class Ingress:
    """The HTTP side: `create_app` over one RayEngine per model deployment."""

    async def __init__(self, config: RayAppConfig, models: list[DeploymentHandle]):  # type: ignore[misc]  # Serve awaits it
        configure_logging()
        server = config.server
        if not server.api_key and os.environ.get(API_KEY_ENV):
            server.api_key = os.environ[API_KEY_ENV]
        self.config = server
        self.engines = [await RayEngine.connect(handle, m.deployment, wait_s=config.replica_wait_s,
                                                retry_after_s=server.retry_after_s)
                        for handle, m in zip(models, config.models)]
        self.laya_app = None  # (`app` is the Serve wrapper's property)

    def __serve_build_asgi_app__(self):
        self.laya_app = create_app(lambda: self.engines, self.config)
        return self.laya_app

    def check_health(self) -> None:
        """What `/ready` says: unhealthy once loading failed."""
        served = self.laya_app.state.served if self.laya_app is not None else None
        if served is not None and served.load_errors:
            raise RuntimeError("; ".join(served.load_errors))


def application(config: RayAppConfig) -> Any:
    """The Serve application: one deployment per model, the ingress over them."""
    names = [m.deployment for m in config.models]
    if len(set(names)) != len(names):
        raise LayaError(f"two models would share a deployment name ({names}); give them distinct names")
    handles = []
    for m in config.models:
        scaling: dict[str, Any] = ({"autoscaling_config": m.autoscaling} if m.autoscaling
                                   else {"num_replicas": m.num_replicas})
        # Serve's drain is laya serve's: a replica being stopped takes no new request and finishes
        # what it holds for at most --drain-s before it is killed.
        handles.append(ModelReplica.options(  # type: ignore[attr-defined]  # added by @serve.deployment
            name=m.deployment, max_ongoing_requests=m.max_ongoing_requests,
            graceful_shutdown_timeout_s=config.server.drain_s,
            ray_actor_options={"num_cpus": m.num_cpus if m.num_cpus is not None else m.threads},
            **scaling).bind(m))
    # The ingress takes every request so the app's own admission decides (429 at the door), rather
    # than Serve's proxy queueing them out of sight.
    ingress = Ingress.options(  # type: ignore[attr-defined]  # added by @serve.deploymentnum_replicas=config.ingress_replicas,
                              max_ongoing_requests=max(256, 4 * config.server.max_concurrency),
                              graceful_shutdown_timeout_s=config.server.drain_s)
    return ingress.bind(config, handles)


def build(args: dict[str, Any]) -> Any:
    """The `import_path` of a Serve config (`laya.server.ray_app:build`): its `args` are a RayAppConfig."""
    return application(RayAppConfig.from_args(args))


# ------------------------------------------------------------------------------------------ laya serve --ray


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join the cluster at `address` (or the one `RAY_ADDRESS` / a local `ray start` names), or start
    a local one on the loopback interface. True when this process started it."""
    if ray.is_initialized():
        return False
    quiet = logging.WARNING
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, logging_level=quiet, configure_logging=True)
        return False
    try:
        ray.init(address="auto", logging_level=quiet, configure_logging=True)
        return False
    except ConnectionError:
        pass
    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level=quiet, configure_logging=True)
    return True


def run(config: RayAppConfig, *, host: str = "127.0.0.1", port: int = 8000, address: str | None = None) -> None:
    """`laya serve --ray`: deploy the app (and the HTTP proxy on host:port), serve until SIGINT/SIGTERM,
    then remove it (and the cluster, when this process started it)."""
    started = connect(address, num_cpus=max(os.cpu_count() or 1, config.cpus_needed()))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port, "keep_alive_timeout_s": KEEP_ALIVE_S})
        try:
            serve.run(application(config), name=APP_NAME, route_prefix="/")
        except RuntimeError as exc:  # a deployment that failed to come up (a model that cannot load)
            raise LayaError(f"could not deploy the models on Ray Serve: {failure(exc)}") from exc
        host, port = proxy_address(host, port)
        log.info("serving on Ray Serve at http://%s:%d (%s)", host, port,
                 ", ".join(f"{m.deployment} x{m.autoscaling or m.num_replicas}" for m in config.models))
        while not stop.wait(1.0):
            pass
    finally:
        if started:  # the cluster goes with the app (its processes are this one's children)
            ray.shutdown()
        else:  # on a cluster of others' the app is removed, within a bound: the cluster may be gone
            remover = threading.Thread(target=_delete_app, daemon=True)
            remover.start()
            remover.join(30)
            if remover.is_alive():
                log.warning("could not remove the app from the Ray cluster within 30 s; `serve delete %s` "
                            "removes it", APP_NAME)


def proxy_address(host: str, port: int) -> tuple[str, int]:
    """Where Serve's HTTP proxy really listens: on a cluster whose Serve was started before, its own
    HTTP options stand and ours are ignored, so say so rather than name an address nobody serves."""
    try:
        from ray.serve.context import _get_global_client

        actual = _get_global_client().http_config  # type: ignore[union-attr]  # None: caught below
    except Exception:  # noqa: BLE001 - a private API; without it the address asked for is reported
        return host, port
    if (actual.host, actual.port) != (host, port):
        log.warning("Serve on this cluster already listens on %s:%d (its HTTP options stand, not %s:%d)",
                    actual.host, actual.port, host, port)
    return actual.host, actual.port


def failure(exc: Exception) -> str:
    """Why the app did not come up: each failed deployment's last line (the model's own error)."""
    try:
        app = serve.status().applications[APP_NAME]
        why = [f"{name}: {d.message.strip().splitlines()[-1]}" for name, d in app.deployments.items()
               if "FAILED" in str(d.status) and d.message.strip()]
    except Exception:  # noqa: BLE001 - the status itself may be out of reach
        why = []
    return ("; ".join(why) or str(exc))[:2000]


def _delete_app() -> None:
    try:
        serve.delete(APP_NAME)
    except Exception as exc:  # noqa: BLE001 - best effort on the way out
        log.warning("could not remove the app from the Ray cluster: %s", exc)


def from_options(options: ServeOptions, *, replicas: int = 1, max_ongoing_requests: int = 32,
                 autoscaling: dict[str, Any] | None = None) -> RayAppConfig:
    """`laya serve --ray`'s command line as a RayAppConfig (every model with the same Serve options)."""
    models = []
    for spec in options.models:
        models.append(ModelConfig(source=spec.source, name=spec.name, runtime=options.runtime,
                                  precision=options.precision, threads=options.threads or 1,
                                  calibration=options.calibration_for(spec),
                                  compact=options.compact,
                                  n_ctx=options.n_ctx, prefix_cache=options.prefix_cache,
                                  readout=spec.readout or options.readout, num_replicas=replicas,
                                  autoscaling=autoscaling, max_ongoing_requests=max_ongoing_requests,
                                  max_wait_ms=options.server.max_wait_ms,
                                  max_batch_rows=options.server.max_batch_rows,
                                  max_batch_tokens=options.server.max_batch_tokens))
    return RayAppConfig(models=models, server=options.server)
