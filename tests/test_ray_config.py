"""The Ray Serve app's configuration, without a cluster: the Serve YAML args laya reads, the options
each deployment gets, and the repository's Serve config and KubeRay manifest as Ray reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from laya.errors import LayaError
from laya.server.ray_app import INGRESS, ModelConfig, RayAppConfig, application, build

ROOT = Path(__file__).resolve().parent.parent


def deployments(app) -> dict:
    """{name: deployment} of a built application (the ingress and what it was bound to)."""
    ingress = app._bound_deployment
    out = {ingress.name: ingress}
    for handle in ingress.init_args[1]:
        out[handle._bound_deployment.name] = handle._bound_deployment
    return out


def test_each_model_is_a_deployment_with_its_own_scaling():
    app = build({"models": [{"source": "/models/a", "name": "a", "num_replicas": 3, "threads": 2,
                             "max_ongoing_requests": 8},
                            {"source": "/models/chat.gguf",
                             "autoscaling": {"min_replicas": 1, "max_replicas": 5, "target_ongoing_requests": 4}}],
                 "server": {"max_concurrency": 100, "limits": {"max_rows": 10}}})
    found = deployments(app)
    assert set(found) == {INGRESS, "a", "chat"}
    a, chat = found["a"], found["chat"]
    assert a._deployment_config.num_replicas == 3 and a._deployment_config.max_ongoing_requests == 8
    assert a.ray_actor_options["num_cpus"] == 2  # a replica reserves the CPUs its threads use
    scaling = chat._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas, scaling.target_ongoing_requests) == (1, 5, 4)
    # the ingress takes every request, so the app's own admission answers overload (429 at the door)
    assert found[INGRESS]._deployment_config.max_ongoing_requests >= 100
    config = found[INGRESS].init_args[0]
    assert config.server.limits.max_rows == 10 and config.server.max_concurrency == 100
    assert RayAppConfig(models=[ModelConfig("/m", num_replicas=2, threads=2),
                                ModelConfig("/n", autoscaling={"max_replicas": 3})]).cpus_needed() == 7


@pytest.mark.parametrize(("args", "message"), [
    ({}, "needs `models`"),
    ({"models": [{"name": "x"}]}, "needs `source`"),
    ({"models": [{"source": "/m", "replicas": 2}]}, "unknown keys ['replicas']"),
    ({"models": ["/m"], "workers": 2}, "unknown laya Ray Serve settings ['workers']"),
    ({"models": ["/a/m", "/b/m"]}, "share a deployment name"),
])
def test_a_bad_config_is_refused_with_what_is_wrong(args, message):
    with pytest.raises(LayaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build(args)


def test_the_repository_serve_config_and_kuberay_manifest_are_what_ray_and_laya_read():
    serve_config = yaml.safe_load((ROOT / "deploy" / "ray-serve.yaml").read_text())
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay-rayservice.yaml").read_text())
    assert manifest["kind"] == "RayService" and manifest["apiVersion"] == "ray.io/v1"
    embedded = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    for config in (serve_config, embedded):
        ServeDeploySchema(**config)
        (app,) = config["applications"]
        assert app["import_path"] == "laya.server.ray_app:build"
        built = deployments(application(RayAppConfig.from_args(app["args"])))
        assert {d["name"] for d in app.get("deployments", [])} <= set(built)  # overrides name real deployments


def test_laya_serve_ray_gives_each_replica_the_batch_bounds_it_was_given():
    """`--max-batch-tokens` reaches a replica's batcher, as `--max-batch-rows` and `--max-wait-ms` do."""
    from laya.server.ray_app import from_options
    from laya.server.serve import ModelSpec, ServeOptions
    from laya.server.state import ServerConfig

    server = ServerConfig(max_batch_rows=32, max_batch_tokens=512, max_wait_ms=2)
    (model,) = from_options(ServeOptions(models=[ModelSpec.parse("enc=nowhere")], server=server)).models
    assert (model.max_batch_rows, model.max_batch_tokens, model.max_wait_ms) == (32, 512, 2)
