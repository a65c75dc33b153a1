"""The default server as users run it (`laya serve`: each model in an engine process of its own, the
request crossing a pipe, its question set a slot number the second time) answers every golden case
as upstream laya does, and refuses what the contract refuses. In-process servers (the other HTTP
tests) do not cross the pipe: a question set that could not key a slot (a score's levels) once made
this path answer 500 while every other test passed."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
from conftest import GOLDEN, need

sys.path.insert(0, str(GOLDEN.parent.parent / "benchmarks"))
from serving import free_port, wait_ready  # noqa: E402

need("onnxruntime")
RECORD = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
FP32 = 1e-4
# refused by the System One contract where upstream answers (tests/test_parity.py says why)
REFUSED = {"choice-numeric-labels", "score-five-structured", "instructions-number", "empty-descriptions"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w+")  # noqa: SIM115 - read back on failure
    models = [arg for name, rel in RECORD["checkpoints"].items() for arg in ("-m", f"{name}={GOLDEN / rel}")]
    process = subprocess.Popen([sys.executable, "-m", "laya.cli", "serve", "--port", str(port), "-r", "onnx",
                                *models], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(url, process, 240):
            log.seek(0)
            pytest.fail(f"laya serve did not come up: {log.read()[-3000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def probabilities(answer: dict) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1.0 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def test_every_golden_case_through_the_engine_process(server):
    health = httpx.get(server + "/health", timeout=10).json()
    assert all(m["instance"] for m in health["models"].values())  # engines in processes of their own
    answered = 0
    with httpx.Client(base_url=server, timeout=60) as client:
        for case in RECORD["cases"]:
            body = {"model": case["checkpoint"], "state": case["state"], "questions": case["questions"]}
            for attempt in ("whole", "by slot"):
                where = f"{case['checkpoint']}:{case['id']} ({attempt})"
                r = client.post("/v1/systemone", json=body)
                if case["id"] in REFUSED:
                    assert r.status_code == 422, (where, r.status_code, r.text[:300])
                    continue
                assert r.status_code == 200, (where, r.text[:500])
                if "error" in case:  # upstream refuses a choice whose markers do not fit: played as a tournament
                    for qid, answer in r.json()["answers"].items():
                        assert answer["x_tournament"]["finalists"], where
                        assert list(answer["probabilities"]) == list(case["questions"][qid]["criteria"]), where
                    continue
                got, want = r.json(), case["response"]
                assert list(got["answers"]) == list(want["answers"]), where
                assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"], where
                for qid, expected in want["answers"].items():
                    dp = float(np.max(np.abs(probabilities(got["answers"][qid]) - probabilities(expected))))
                    assert dp <= FP32, f"{where} {qid}: max |dp| {dp:.2e}"
                answered += 1
    assert answered >= 2 * 35
    assert {q["type"] for c in RECORD["cases"] for q in c["questions"].values()} == {"choice", "score", "noul"}


def test_the_benchmarks_raw_client_reads_the_answers_httpx_reads(server):
    """`benchmarks/overhead.py` times HTTP through `serving.RawConnection`; it must read whole answers,
    their status and bytes the same as a full client does, or its figure would time something else."""
    from serving import RawConnection

    case = next(c for c in RECORD["cases"] if c["id"] not in REFUSED and "error" not in c)
    body = json.dumps({"model": case["checkpoint"], "state": case["state"], "questions": case["questions"]}).encode()
    port = int(server.rsplit(":", 1)[1])
    raw = RawConnection(port)
    try:
        post, broken = raw.poster("/v1/systemone", body), raw.poster("/v1/systemone", b'{"model": ')
        for _ in range(3):  # one keep-alive connection: each answer read to its end and no further
            status, text = post()
            assert status == 200
            want = httpx.post(server + "/v1/systemone", content=body, headers={"content-type": "application/json"})
            assert json.loads(text)["answers"] == want.json()["answers"]
            status, text = broken()
            assert status == 422 and json.loads(text)["detail"]
    finally:
        raw.close()
