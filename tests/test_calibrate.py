"""`laya calibrate` end to end: labelled data in, a calibration file, a report and plots out, and the
file applied by `laya.load`, `laya predict` and `laya serve`, on both engines."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from conftest import load_quiet, need

from laya.calibration.data import DataError, read_records
from laya.calibration.file import load_calibration
from laya.cli import main
from laya.errors import CheckpointError

QUESTIONS = {"team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "sales", "support"]},
             "level": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "angry"]},
             "urgent": {"type": "noul", "instructions": "Urgent?"}}
WORDS = ["refund", "invoice", "order", "late", "angry", "happy", "billing", "shipping", "login", "password",
         "cancel", "upgrade"]


def write_data(model, path, n: int, temperature: float | None, seed: int = 0):
    """Lines whose labels are drawn from the model's own logits at `temperature` (None: uniformly)."""
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    states = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(n)]
    evidence = model.evidence([model.prepare(states, QUESTIONS)])[0] if model is not None else None
    with open(path, "w", encoding="utf-8") as out:
        for i, state in enumerate(states):
            labels = {}
            for j, (qid, q) in enumerate(QUESTIONS.items()):
                k = 2 if q["type"] == "noul" else len(q["criteria"])
                if temperature is None:
                    idx = int(np_rng.integers(k))
                else:
                    idx = int(np_rng.choice(k, p=evidence[i][j].probabilities(temperature)))
                labels[qid] = q["criteria"][idx] if q["type"] == "choice" else (
                    idx if q["type"] == "score" else bool(idx))
            out.write(json.dumps({"state": state, "questions": QUESTIONS, "labels": labels}) + "\n")
    return path


@pytest.fixture(scope="module")
def encoder_run(checkpoint_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    model = load_quiet(checkpoint_dir)
    data = write_data(model, root / "data.jsonl", 400, temperature=0.5)
    code = main(["calibrate", str(checkpoint_dir), str(data), "--out", str(root / "cal.json"),
                 "--report-dir", str(root / "report"), "--target-precision", "0.5", "--min-bucket", "50"])
    assert code == 0
    return root, data


def test_calibrate_writes_file_report_and_plots(encoder_run, capsys):
    root, _ = encoder_run
    cal = load_calibration(root / "cal.json")
    assert set(cal.temperature) == {"choice", "score", "noul"}
    report = json.loads((root / "report" / "calibration-report.json").read_text())
    split = report["split"]
    assert split["train_lines"] + split["heldout_lines"] == 400 and split["heldout_lines"] == 120
    assert split["heldout_answers"] == 3 * 120
    for side in ("before", "after"):
        overall = report["heldout"][side]["overall"]
        assert {"accuracy", "nll", "brier", "ece", "ece_bins", "auroc_top_probability",
                "auroc_act_probability"} <= set(overall)
        assert {"choice", "choice:3-5", "score:3-5", "noul:2"} <= set(report["heldout"][side]["groups"])
    for name in ("reliability.png", "coverage.png"):
        assert (root / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (root / "report" / "calibration-report.txt").read_text()
    assert "overall" in text and "ECE" in text and "fitted temperatures" in text


def test_labels_drawn_sharper_than_the_model_fit_a_sharper_temperature(encoder_run, checkpoint_dir, tmp_path):
    """Labels from softmax(z / 0.5) fit T < 1; uniformly random labels fit the flattest T allowed."""
    root, _ = encoder_run
    sharp = load_calibration(root / "cal.json")
    assert all(t < 1.0 for t in sharp.temperature.values()), sharp.temperature
    model = load_quiet(checkpoint_dir)
    noise = write_data(model, tmp_path / "noise.jsonl", 300, temperature=None, seed=1)
    assert main(["calibrate", str(checkpoint_dir), str(noise), "--out", str(tmp_path / "noise.json")]) == 0
    flat = load_calibration(tmp_path / "noise.json")
    assert all(t > 2.0 for t in flat.temperature.values()), flat.temperature


def test_the_calibration_applies_over_the_checkpoint(encoder_run, checkpoint_dir):
    root, _ = encoder_run
    cal = load_calibration(root / "cal.json")
    plain = load_quiet(checkpoint_dir)
    model = load_quiet(checkpoint_dir, calibration=root / "cal.json")
    assert model.temperatures.for_question("choice", 3) == cal.temperature_by_options.get(
        "choice:3-5", cal.temperature["choice"])
    # the checkpoint's own bucket values of a fitted type are replaced, not mixed in
    assert model.temperatures.for_question("choice", 12) == cal.temperature["choice"]
    assert "choice:11+" in plain.temperatures.by_bucket and "choice:11+" not in model.temperatures.by_bucket
    answer = model.predict("refund please", QUESTIONS)["answers"]
    threshold = cal.abstention.threshold_for("choice", 3)
    assert answer["team"]["x_threshold"] == threshold
    assert answer["team"]["x_abstain"] is (answer["team"]["x_answer_confidence"] < threshold)
    assert "x_act_probability" in answer["team"]
    assert "x_abstain" not in plain.predict("refund please", QUESTIONS)["answers"]["team"]


def test_a_calibration_for_another_model_is_refused(encoder_run, mmbert_dir):
    root, _ = encoder_run
    with pytest.raises(CheckpointError, match="fitted on another model"):
        load_quiet(mmbert_dir, calibration=root / "cal.json")


def test_predict_and_serve_take_the_calibration(encoder_run, checkpoint_dir, capsys):
    root, _ = encoder_run
    assert main(["predict", "-m", str(checkpoint_dir), "-s", "refund please", "-q", json.dumps(QUESTIONS),
                 "--calibration", str(root / "cal.json")]) == 0
    assert "x_abstain" in json.loads(capsys.readouterr().out)["answers"]["urgent"]
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    options = ServeOptions(calibration={"m": str(root / "cal.json")})
    engine = load_engine(ModelSpec(str(checkpoint_dir), name="m"), options)
    assert engine.model.abstention is not None
    import httpx
    from live_server import LiveServer

    from laya.server.app import create_app

    with LiveServer(create_app(lambda: [engine])) as live:
        reply = httpx.post(live.url + "/v1/systemone", json={"model": "m", "state": "refund please",
                                                             "questions": QUESTIONS}, timeout=30)
    assert reply.status_code == 200
    for answer in reply.json()["answers"].values():
        assert isinstance(answer["x_abstain"], bool) and 0.0 < answer["x_threshold"] <= 1.0
    assert main(["serve", "-m", f"m={checkpoint_dir}", "--calibration", f"other={root / 'cal.json'}"]) == 2
    assert "no model is named 'other'" in capsys.readouterr().err


@pytest.mark.parametrize("line, message", [
    ("not json", "not valid JSON"),
    ('{"state": "x", "questions": {}}', "needs .state., .questions. and one of .labels."),
    (json.dumps({"state": "x", "questions": QUESTIONS, "gold": {"urgent": [0.5]}}), "must give 2 probabilities"),
    (json.dumps({"state": "x", "questions": QUESTIONS, "gold": {"urgent": {"maybe": 1}}}), "gold keys must be"),
    (json.dumps({"state": "x", "questions": QUESTIONS, "labels": {"team": "finance"}}), "option names"),
    (json.dumps({"state": "x", "questions": QUESTIONS, "labels": {"level": 3}}), "level index 0..2"),
    (json.dumps({"state": "x", "questions": QUESTIONS, "labels": {"urgent": "yes"}}), "true or false"),
    (json.dumps({"state": "x", "questions": QUESTIONS, "labels": {"nope": 1}}), "not one of the questions"),
])
def test_bad_data_names_the_line(tmp_path, line, message):
    good = json.dumps({"state": "x", "questions": QUESTIONS, "labels": {"urgent": True}})
    path = tmp_path / "d.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError, match=f"d.jsonl:2: .*{message}"):
        read_records(path)


def test_bad_calibration_files_are_clear_errors(tmp_path, checkpoint_dir):
    bad = tmp_path / "c.json"
    for content, message in [("{", "not a JSON calibration file"), ("{}", "not a laya calibration file"),
                             (json.dumps({"format": "laya-calibration", "version": 1, "temperature": {"choice": 0.1}}),
                              "not a temperature in"),
                             (json.dumps({"format": "laya-calibration", "version": 1,
                                          "temperature_by_options": {"choice:7": 1.0}}), "unknown key")]:
        bad.write_text(content)
        with pytest.raises(CheckpointError, match=message):
            load_quiet(checkpoint_dir, calibration=bad)


def test_decide_engine_calibrates_per_type(tmp_path):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.llama import open_gguf
    from laya.testing.chat_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = write_data(None, tmp_path / "d.jsonl", 60, temperature=None)
    assert main(["calibrate", str(gguf), str(data), "--out", str(tmp_path / "cal.json"),
                 "--target-precision", "0.3", "--min-bucket", "5"]) == 0
    cal = load_calibration(tmp_path / "cal.json")
    assert set(cal.temperature) == {"choice", "score", "noul"} and not cal.temperature_by_options
    model = open_gguf(gguf, calibration=tmp_path / "cal.json")
    assert cal.model == model.fingerprint and len(cal.model) == 64
    answer = model.predict("refund please", QUESTIONS)["answers"]
    assert {"x_abstain", "x_threshold", "x_outside_mass"} <= set(answer["urgent"])
    assert model.temperatures.for_question("noul", 2) == cal.temperature["noul"]
