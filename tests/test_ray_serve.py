"""laya on Ray Serve, on a local cluster whose HTTP proxy listens on the loopback interface.

The project's contract tests and the official clients' tests (`test_server`) run here unchanged
against the Ray deployment; requests that meet in a replica share forward passes and are answered
bit for bit as alone; a replica killed under steady load loses no request and is replaced; the
repository's Serve config deploys through Ray's own `serve run`, and a rolling change of it
(replica count and a new calibration file) drops nothing.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import ray
import test_server as contract
import yaml
from conftest import load_quiet
from live_server import free_port
from ray import serve
from ray.serve.schema import ServeDeploySchema
from test_server import KEY, ROUTE, STATE, URGENT

from laya.calibration.file import Calibration
from laya.limits import Limits
from laya.request import Request
from laya.server.app import ServerConfig
from laya.server.ray_app import APP_NAME, ModelConfig, RayAppConfig, application, connect

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
HTTP = {"host": "127.0.0.1", "keep_alive_timeout_s": 65}

# The contract tests of `test_server` that hold for the Ray deployment, collected here; those of the
# `keyed` app first, then those of the `server` app (which this module's own tests below serve too), so
# that the cluster deploys each app once: a change of app takes several seconds.
CONTRACT = ("test_answers_every_question_type", "test_auth", "test_bad_json_and_non_object", "test_batch_route",
            "test_body_too_large", "test_compressed_bodies", "test_health_ready_metrics_docs", "test_jev_lite",
            "test_markers_that_do_not_fit_are_answered_by_a_tournament", "test_models_route_and_named_models",
            "test_non_ascii_option_names_round_trip", "test_official_sdk_with_zstd",
            "test_pydantic_ai_typesafe_and_system_one_models", "test_request_forms",
            "test_schema_errors_are_fastapi_shaped_422", "test_state_forms", "test_token_budget",
            "test_unknown_model_is_404")


def _serves_the_server_app(name: str) -> bool:
    return "keyed" not in inspect.signature(getattr(contract, name)).parameters


globals().update({name: getattr(contract, name) for name in sorted(CONTRACT, key=_serves_the_server_app)})


@pytest.fixture(scope="module", autouse=True)
def one_thread_like_the_replicas():
    """The replicas run one torch thread each (ModelConfig.threads = 1); the answers this process computes
    to compare with theirs bit for bit run one too. Otherwise the comparison would also pin this
    machine's core count: BLAS kernels may split a matmul differently over more threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Cluster:
    url: str
    port: int
    address: str
    deployed: RayAppConfig | None = None

    def deploy(self, config: RayAppConfig) -> SimpleNamespace:
        """Serve `config` as the app (replacing what was there), once ready; a no-op when it already is."""
        if self.deployed != config:
            serve.run(application(config), name=APP_NAME, route_prefix="/")
            self.deployed = config
            wait_answering(self.url, config.models[0].name or Path(config.models[0].source).name,
                           key=config.server.api_key)
        return SimpleNamespace(url=self.url)


def wait_answering(url: str, model: str, seconds: float = 240, check=None, key: str | None = None) -> dict:
    """Until `model` answers a request (and `check(body)` holds): a replaced app answers only once its
    new deployments are up."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            r = httpx.post(url + "/v1/systemone", json={"model": model, "state": STATE, "questions": {"u": URGENT}},
                           timeout=30, headers={"authorization": f"Bearer {key}"} if key else {})
            if r.status_code == 200 and (check is None or check(r.json())):
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{model} never answered at {url}")


@pytest.fixture(scope="module")
def cluster():
    connect(None, num_cpus=8)  # logical CPUs: the replicas of these tests, one thread each
    port = free_port()
    serve.start(http_options={**HTTP, "port": port})
    try:
        yield Cluster(url=f"http://127.0.0.1:{port}", port=port, address=ray.get_runtime_context().gcs_address)
    finally:
        serve.shutdown()
        ray.shutdown()


def contract_config(checkpoint_dir, mmbert_dir) -> RayAppConfig:
    """What `test_server`'s `server` fixture serves: both test checkpoints on torch, batches waiting 20 ms."""
    return RayAppConfig(models=[ModelConfig(source=str(checkpoint_dir), runtime="torch", max_wait_ms=20),
                                ModelConfig(source=str(mmbert_dir), runtime="torch")],
                        server=ServerConfig(max_wait_ms=20))


@pytest.fixture
def server(cluster, checkpoint_dir, mmbert_dir):
    return cluster.deploy(contract_config(checkpoint_dir, mmbert_dir))


@pytest.fixture
def keyed(cluster, checkpoint_dir):
    return cluster.deploy(RayAppConfig(models=[ModelConfig(source=str(checkpoint_dir), runtime="torch")],
                                       server=ServerConfig(api_key=KEY)))


def test_requests_that_meet_in_a_replica_share_batches_and_answer_bit_for_bit(server, model, checkpoint_dir):
    questions = {"t": ROUTE, "u": URGENT}
    states = [f"{STATE} {i} " * (1 + i % 3) for i in range(12)]
    handle = serve.get_deployment_handle(Path(checkpoint_dir).name, app_name=APP_NAME)
    replies = [r.result(timeout_s=120) for r in
               [handle.answer.remote(Request.of([s], questions), Limits()) for s in states]]
    assert all(reply[0] == "ok" for reply in replies), replies
    assert max(reply[2]["batch_jobs"] for reply in replies) > 1  # they did share forward passes
    for state, reply in zip(states, replies):
        alone = model.predict(state, questions)
        got = reply[1][0].to_json()  # a replica answers typed responses
        assert got["answers"] == alone["answers"] and got["usage"] == alone["usage"]
    # and over HTTP, concurrently, through the ingress, whose /metrics count each replica batch once
    before = batch_jobs(server.url)
    with httpx.Client(timeout=60) as client:
        def ask(state):
            return client.post(server.url + "/v1/systemone", json={"state": state, "questions": questions}).json()

        threads, out = [], {}
        for s in states:
            threads.append(threading.Thread(target=lambda s=s: out.__setitem__(s, ask(s))))
            threads[-1].start()
        for t in threads:
            t.join(120)
    assert all(out[s]["answers"] == model.predict(s, questions)["answers"] for s in states)
    after = batch_jobs(server.url)
    batches, jobs = after[0] - before[0], after[1] - before[1]
    assert jobs == len(states) and 1 <= batches <= len(states)


def batch_jobs(url: str) -> tuple[int, int]:
    """(batches, jobs in them) from the ingress's laya_batch_jobs histogram."""
    text = httpx.get(url + "/metrics").text
    count = re.search(r"^laya_batch_jobs_count (\S+)$", text, re.M)
    total = re.search(r"^laya_batch_jobs_sum (\S+)$", text, re.M)
    return int(float(count.group(1))), int(float(total.group(1)))


def test_a_refusal_in_a_replica_keeps_its_type_and_fields(server, checkpoint_dir):
    handle = serve.get_deployment_handle(Path(checkpoint_dir).name, app_name=APP_NAME)
    kind, exc = handle.answer.remote(Request.of(["x"] * 3, {"u": URGENT}), Limits(max_rows=2)).result(timeout_s=60)
    assert kind == "error" and type(exc).__name__ == "LimitExceeded" and exc.limit == 2 and exc.flag == "--max-rows"


def test_a_plan_through_the_ingress_is_the_replicas_and_what_the_answer_uses(server, checkpoint_dir):
    name = Path(checkpoint_dir).name
    body = {"model": name, "state": STATE * 30, "questions": {"u": URGENT}}
    planned = httpx.post(server.url + "/v1/systemone/plan", json=body, timeout=60)
    assert planned.status_code == 200, planned.text
    answered = httpx.post(server.url + "/v1/systemone", json=body, timeout=60).json()
    plan = planned.json()
    assert plan["model"] == name and plan["runtime"] == "torch" and plan["refused"] is None
    assert plan["input_tokens"] == answered["usage"]["input_tokens"]
    assert plan["states"][0]["state_tokens_kept"] == answered["x_usage"]["state_tokens_kept"]


@dataclass
class Load:
    """Steady load: `threads` clients each posting one request after another; every outcome recorded."""

    url: str
    model: str
    threads: int = 4
    timeout_s: float = 90.0
    outcomes: list = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Load:
        self.workers = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)]
        for w in self.workers:
            w.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(self.timeout_s + 10)
        assert not any(w.is_alive() for w in self.workers), "a client is still waiting past its timeout"

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                began = time.monotonic()
                try:
                    r = client.post(self.url + "/v1/systemone", json={
                        "model": self.model, "state": f"{STATE} client {i} request {n}", "questions": {"u": URGENT}})
                    self.outcomes.append((began, r.status_code, r.headers.get("retry-after"), r.text[:300]))
                except httpx.HTTPError as exc:
                    self.outcomes.append((began, type(exc).__name__, None, str(exc)[:300]))

    def since(self, t: float) -> list:
        return [o for o in self.outcomes if o[0] >= t]

    def check(self, allow_unavailable: bool) -> None:
        """Every request answered: 200, or (while no replica was alive) 429/503 with Retry-After."""
        assert self.outcomes
        for _, status, retry_after, text in self.outcomes:
            if status == 200:
                continue
            assert allow_unavailable and status in (429, 503) and retry_after, (status, text)


def replica_stats(handle, calls: int = 40) -> dict[int, int]:
    """{pid: requests answered} of the replicas the router reaches in `calls` calls."""
    seen: dict[int, int] = {}
    for _ in range(calls):
        stats = handle.stats.remote().result(timeout_s=30)
        seen[stats["pid"]] = max(seen.get(stats["pid"], 0), stats["answered"])
    return seen


def test_a_replica_killed_under_load_loses_no_request_and_is_replaced(cluster, checkpoint_dir):
    config = RayAppConfig(models=[ModelConfig(source=str(checkpoint_dir), name="pair", runtime="torch",
                                              num_replicas=2)])
    cluster.deploy(config)
    handle = serve.get_deployment_handle("pair", app_name=APP_NAME)
    before = replica_stats(handle)
    assert len(before) == 2, before
    victim = min(before)
    with Load(cluster.url, "pair") as load:
        time.sleep(3)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        deadline, replacement = time.monotonic() + 240, None
        while replacement is None and time.monotonic() < deadline:
            time.sleep(1)
            now = replica_stats(handle, calls=10)
            replacement = next((pid for pid, n in now.items() if pid not in before and n > 0), None)
        time.sleep(2)
    assert replacement is not None, "no replacement replica took traffic"
    load.check(allow_unavailable=False)  # the other replica was alive throughout: every request answered 200
    assert len(load.since(killed_at)) > 10
    assert victim not in replica_stats(handle, calls=10)


def test_the_repository_config_deploys_with_serve_run_and_a_rolling_change_drops_nothing(
        cluster, checkpoint_dir, tmp_path):
    config = yaml.safe_load((ROOT / "deploy" / "ray-serve.yaml").read_text())
    ServeDeploySchema(**config)  # what `serve run` / `serve deploy` accept
    args = config["applications"][0]["args"]
    model = args["models"][0]
    model.update(name="roll", source=str(checkpoint_dir), runtime="torch", num_replicas=2)
    model.pop("autoscaling")
    args["server"]["loopback_only"] = True
    config["http_options"].update(HTTP, port=cluster.port)

    def serve_run(cfg: dict) -> None:
        path = tmp_path / f"serve-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        done = subprocess.run([str(Path(sys.executable).parent / "serve"), "run", "--address", cluster.address,
                               "--non-blocking", str(path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    serve_run(config)
    cluster.deployed = None  # replaced behind the fixture's back
    first = wait_answering(cluster.url, "roll")
    calibration = tmp_path / "flat.json"
    Calibration(model="", temperature={"noul": 5.0}).save(calibration)
    expected = load_quiet(checkpoint_dir, calibration=calibration).predict(STATE, {"u": URGENT})["answers"]
    assert expected != first["answers"]
    with Load(cluster.url, "roll") as load:
        time.sleep(2)
        model.update(num_replicas=1, calibration=str(calibration))
        serve_run(config)
        wait_answering(cluster.url, "roll", check=lambda body: body["answers"] == expected)
        time.sleep(5)  # the old replicas drain and stop meanwhile
    load.check(allow_unavailable=False)
    assert len(load.outcomes) > 20
    assert len(replica_stats(serve.get_deployment_handle("roll", app_name=APP_NAME), calls=20)) == 1


def test_with_no_replica_alive_requests_get_503_with_retry_after_until_the_replacement_answers(
        cluster, checkpoint_dir):
    config = RayAppConfig(models=[ModelConfig(source=str(checkpoint_dir), name="solo", runtime="torch")],
                          replica_wait_s=1.0)
    cluster.deploy(config)
    handle = serve.get_deployment_handle("solo", app_name=APP_NAME)
    (victim,) = replica_stats(handle, calls=3)
    with Load(cluster.url, "solo", threads=2, timeout_s=30) as load:
        time.sleep(2)
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_answering(cluster.url, "solo")
        answered_again = time.monotonic()
        time.sleep(2)
    load.check(allow_unavailable=True)  # 200, or 503 with Retry-After: never a hang, a 5xx without it, a reset
    gap = [o for o in load.since(killed_at) if o[1] != 200]
    assert gap and all(o[1] == 503 and o[0] < answered_again for o in gap), gap[:3]
    assert any(o[1] == 200 for o in load.since(answered_again))
