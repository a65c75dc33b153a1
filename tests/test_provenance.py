"""Models that say what they are: `/v1/models`, `/health` (behind the key) and `laya info` name the
artifacts that answer by sha256 (weights, config, tokenizer, the calibration file), the runtime,
precision and processor, the limits, and no machine path; each answer carries the short model digest
(`X-Laya-Model-Digest`), so a caller can tell which artifact answered."""

from __future__ import annotations

import hashlib
import json
import warnings

import httpx
import pytest
from conftest import need
from live_server import LiveServer

need("fastapi")

from laya.calibration.file import Calibration  # noqa: E402
from laya.engines import open_engine  # noqa: E402
from laya.native.cpu import cpu  # noqa: E402
from laya.server.app import create_app  # noqa: E402
from laya.server.state import ServerConfig  # noqa: E402

KEY = "provenance-test-key"
QUESTIONS = {"u": {"type": "noul", "instructions": "Urgent?"}}


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "fitted.json"
    Calibration(model="", temperature={"choice": 1.5, "score": 1.0, "noul": 0.8}).save(path)
    return path


@pytest.fixture(scope="module")
def engines(checkpoint_dir, mmbert_dir, calibration):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [open_engine(str(checkpoint_dir), name="first", runtime="torch", calibration=str(calibration)),
                open_engine(str(mmbert_dir), name="second", runtime="torch")]


def test_an_engine_names_its_artifacts_by_sha256(engines, checkpoint_dir, calibration):
    first, second = engines
    assert first.info.digests["weights"] == sha256(checkpoint_dir / "model.safetensors")
    assert first.info.digests["config"] == sha256(checkpoint_dir / "rl_agent_config.json")
    assert first.info.digests["calibration"] == sha256(calibration)
    assert set(first.info.digests) == {"weights", "config", "tokenizer", "calibration"}
    assert len(first.info.digest) == 12 and first.info.digest != second.info.digest
    described = first.describe()
    assert described["model_digest"] == first.info.digest and described["calibration"] == "fitted.json"
    assert described["device"] == (cpu().model or described["device"])


@pytest.mark.parametrize("key", [None, KEY])
def test_models_and_health_say_what_answers_with_a_key_and_without(engines, checkpoint_dir, key):
    auth = {"Authorization": f"Bearer {KEY}"} if key else {}
    with LiveServer(create_app(lambda: engines, ServerConfig(api_key=key))) as live:
        if key:
            assert httpx.get(live.url + "/v1/models", timeout=30).status_code == 401
            assert httpx.get(live.url + "/health", timeout=30).json() == {"status": "ok"}
        listed = httpx.get(live.url + "/v1/models", headers=auth, timeout=30)
        health = httpx.get(live.url + "/health", headers=auth, timeout=30)
        answer = httpx.post(live.url + "/v1/systemone", headers=auth, timeout=60,
                            json={"model": "first", "state": "charged twice", "questions": QUESTIONS})
    assert listed.status_code == health.status_code == answer.status_code == 200
    first = next(m for m in listed.json()["models"] if m["name"] == "first")
    assert first["x_digests"] == dict(engines[0].info.digests) and first["x_model_digest"] == engines[0].info.digest
    assert first["x_runtime"] == "torch" and first["x_precision"] == "fp32" and first["x_device"]
    assert first["x_calibration"] == "fitted.json"
    assert first["x_limits"]["states"] == 256 and first["x_limits"]["options"] == 255
    assert health.json()["models"]["first"]["digests"] == first["x_digests"]
    assert answer.headers["X-Laya-Model-Digest"] == engines[0].info.digest
    for body in (listed.text, health.text):  # no machine path
        assert str(checkpoint_dir) not in body and str(checkpoint_dir.parent) not in body


def test_laya_info_gives_the_digests_and_no_machine_path(checkpoint_dir, capsys):
    from laya.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert main(["info", "-m", str(checkpoint_dir), "-r", "torch", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["digests"]["weights"] == sha256(checkpoint_dir / "model.safetensors")
    assert len(info["model_digest"]) == 12 and str(checkpoint_dir.parent) not in json.dumps(info)
