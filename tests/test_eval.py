"""`laya eval`: the benchmark of methods over a labelled set, its figures recomputed here from the
answers it kept, resumed after an interruption, against a server over HTTP, and as a CI gate."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import need
from live_server import LiveServer

from laya.apps import evaluation, jsonl
from laya.calibration.data import read_records

QUESTIONS = {
    "team": {"type": "choice", "instructions": "Which team?",
             "criteria": {"billing": "payments", "sales": "pricing", "support": "bugs"}},
    "urgent": {"type": "noul", "instructions": "Urgent?"},
}
STATES = ["I was charged twice", "How much is the pro plan?", "The app crashes on start", "Refund please",
          "Do you offer discounts?", "Login page is broken", "Invoice is wrong", "Enterprise pricing?",
          "Error 500 on upload", "Cancel my card charge", "Which plan has SSO?", "Export fails silently"]
TEAMS = ["billing", "sales", "support"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "labelled.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for i, state in enumerate(STATES):
            out.write(json.dumps({"state": state, "questions": QUESTIONS,
                                  "labels": {"team": TEAMS[i % 3], "urgent": i % 2 == 0},
                                  "tags": ["even" if i % 2 == 0 else "odd"], "lang": "en"}) + "\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "laya.cli", "eval", *args, "--no-progress"], capture_output=True,
                          text=True, timeout=600)


def recomputed(records, outcomes, precision: float) -> dict:
    """The figures, by this test's own arithmetic over the kept answers."""
    ps, ys, right, ms = [], [], [], []
    for record in records:
        answers = outcomes[evaluation.key_of(record)]["response"]["answers"]
        ok = True
        for q in record.parsed:
            a = answers[q.qid]
            p = [1 - a["noul"], a["noul"]] if q.qtype == "noul" else [a["probabilities"][k] for k in q.keys]
            y = record.labels[q.qid]
            ps.append(p)
            ys.append(y)
            ok = ok and max(range(len(p)), key=p.__getitem__) == y
        right.append(ok)
        ms.append(outcomes[evaluation.key_of(record)]["ms"])
    hits = [max(range(len(p)), key=p.__getitem__) == y for p, y in zip(ps, ys)]
    top = [max(p) for p in ps]
    order = sorted(range(len(top)), key=lambda i: top[i])
    sizes = [len(order) // 10 + (b < len(order) % 10) for b in range(10)]  # ten equal-mass bins, the first fuller
    cut = [order[sum(sizes[:b]): sum(sizes[: b + 1])] for b in range(10)]
    ece = sum(len(c) * abs(sum(top[i] for i in c) / len(c) - sum(hits[i] for i in c) / len(c)) for c in cut if c)
    by_conf = sorted(range(len(top)), key=lambda i: -top[i])
    coverage = 0.0
    for k in range(1, len(by_conf) + 1):
        distinct = k == len(by_conf) or top[by_conf[k]] < top[by_conf[k - 1]]
        if distinct and sum(hits[i] for i in by_conf[:k]) / k >= precision:
            coverage = k / len(by_conf)
    return {"accuracy": sum(hits) / len(hits), "all_right": sum(right) / len(right),
            "nll": sum(-math.log(max(p[y], 1e-12)) for p, y in zip(ps, ys)) / len(ps),
            "brier": sum(sum((pi - (j == y)) ** 2 for j, pi in enumerate(p)) for p, y in zip(ps, ys)) / len(ps),
            "ece": ece / len(top), "coverage": coverage, "ms_p50": float(np.median(ms))}


def test_two_methods_side_by_side_with_figures_a_test_recomputes(data, checkpoint_dir, tmp_path):
    need("llama_cpp", "the [llama] extra is not installed")
    from laya.testing.chat_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx=1024)
    report = tmp_path / "report.json"
    methods = [f"{checkpoint_dir}:torch", f"{gguf}:answer-slot"]
    done = run_cli(str(data), "-m", methods[0], "-m", methods[1], "--json", str(report), "--plot",
                   str(tmp_path / "plot.png"), "--target-precision", "0.5")
    assert done.returncode == 0, done.stderr
    rep = json.loads(report.read_text())
    assert list(rep["methods"]) == methods and rep["records"] == len(STATES)
    assert "| method |" in done.stdout and f"`{methods[1]}`" in done.stdout
    records = read_records(data)
    for spec in methods:
        kept = jsonl.outcomes(tmp_path / "report.work" / f"{evaluation.parse_method(spec).slug}.jsonl")
        want, got = recomputed(records, kept, 0.5), rep["methods"][spec]
        for key in ("accuracy", "all_right", "nll", "brier", "ece"):
            assert got[key] == pytest.approx(want[key], abs=1e-9), (spec, key)
        assert got["coverage"]["coverage"] == pytest.approx(want["coverage"])
        assert got["ms"]["p50"] == pytest.approx(want["ms_p50"]) and got["ms"]["p50"] > 0
        assert got["answered"] == len(STATES) and got["tokens"]["mean"] > 0
        assert set(got["by"]["tag"]) == {"even", "odd"} and got["by"]["lang"]["en"]["n"] == len(STATES)
    assert (tmp_path / "plot.png").stat().st_size > 1000
    # the report is a CI gate: the same run against itself passes, against a better baseline fails
    again = run_cli(str(data), "-m", methods[0], "-m", methods[1], "--json", str(tmp_path / "again.json"),
                    "--work", str(tmp_path / "report.work"), "--baseline", str(report))
    assert again.returncode == 0, again.stderr
    better = json.loads(report.read_text())
    better["methods"][methods[0]]["accuracy"] += 0.05
    (tmp_path / "better.json").write_text(json.dumps(better))
    gate = run_cli(str(data), "-m", methods[0], "-m", methods[1], "--work", str(tmp_path / "report.work"),
                   "--baseline", str(tmp_path / "better.json"), "--max-drop", "0.02")
    assert gate.returncode == 1 and "regression" in gate.stderr and methods[0] in gate.stderr


def test_a_run_resumes_asking_only_what_it_has_not_and_an_edited_line_again(data, checkpoint_dir, tmp_path):
    records = read_records(data)
    method = evaluation.parse_method(f"{checkpoint_dir}:torch")
    work = tmp_path / "work"
    first = evaluation.run_method(method, records[:5], work, progress=False)  # "interrupted" after five
    assert len(first) == 5
    out = work / f"{method.slug}.jsonl"
    asked = out.read_text().count("\n")
    full = evaluation.run_method(method, records, work, progress=False)
    assert len(full) == len(records) and out.read_text().count("\n") == asked + len(records) - 5
    assert all(full[k] == v for k, v in first.items())  # the five kept, not asked again
    edited = [records[0].__class__(**{**records[0].__dict__, "state": "something else"}), *records[1:]]
    evaluation.run_method(method, edited, work, progress=False)
    assert out.read_text().count("\n") == asked + len(records) - 5 + 1  # only the edited line


def test_a_server_is_a_method_and_its_failures_are_counted_not_fatal(data, model, tmp_path):
    from laya.encoder.engine import EncoderEngine
    from laya.server.app import create_app

    records = read_records(data)
    with LiveServer(create_app(lambda: [EncoderEngine(model)])) as live:
        method = evaluation.parse_method(f"{live.url}/v1/systemone#model={model.name}")
        assert (method.source, method.model) == (live.url, model.name)
        outcomes = evaluation.run_method(method, records, tmp_path, concurrency=3, progress=False)
        local = evaluation.run_method(evaluation.parse_method(f"{live.url}#model=nonesuch"), records, tmp_path,
                                      progress=False)
    figures = evaluation.figures(records, outcomes)
    assert figures["answered"] == len(records) and figures["failed"] == 0 and figures["ms"]["p90"] > 0
    missing = evaluation.figures(records, local)
    assert missing["answered"] == 0 and missing["failed"] == len(records)
    assert all(o["error"]["status"] == 404 for o in local.values())


def test_bad_methods_and_arguments_are_clear_errors(data, tmp_path):
    with pytest.raises(Exception, match="#model=NAME"):
        evaluation.parse_method("http://x#nope")
    assert evaluation.parse_method("laya-multilingual:onnx").runtime == "onnx"
    assert evaluation.parse_method("chat.gguf:decider").readout == "answer-slot"
    done = run_cli(str(data), "-m", "a", "-m", "a")
    assert done.returncode != 0 and "named twice" in done.stderr
    done = run_cli(str(data), "-m", "a", "--baseline", str(tmp_path / "none.json"))
    assert done.returncode != 0 and "--baseline" in done.stderr


def test_the_encoder_lens_ends_at_the_answer_and_says_where_answers_settle(data, checkpoint_dir, tmp_path):
    lens = tmp_path / "lens.jsonl"
    report = tmp_path / "report.json"
    method = f"{checkpoint_dir}:onnx"
    done = run_cli(str(data), "-m", method, "--json", str(report), "--lens", str(lens))
    assert done.returncode == 0, done.stderr
    assert "settle at layer" in done.stderr
    lines = [json.loads(x) for x in lens.read_text().splitlines()]
    records = {r.line: r for r in read_records(data)}
    kept = jsonl.outcomes(tmp_path / "report.work" / f"{evaluation.parse_method(method).slug}.jsonl")
    assert len(lines) == 2 * len(records)
    for line in lines:
        record = records[line["line"]]
        answer = kept[evaluation.key_of(record)]["response"]["answers"][line["question"]]
        q = next(q for q in record.parsed if q.qid == line["question"])
        assert len(line["layers"]) == 4  # the generated checkpoint's encoder layers
        assert line["layers"][-1] == pytest.approx(list(evaluation.probabilities(q, answer)), abs=1e-5)
        assert 1 <= line["settles_at"] <= 4
    summary = json.loads(report.read_text())["methods"][method]["lens"]
    assert summary["answers"] == len(lines) and summary["settled_by_layer"][-1] == 1.0
    assert summary["settles_at_mean"] == pytest.approx(sum(x["settles_at"] for x in lines) / len(lines))
    done = run_cli(str(data), "-m", "http://127.0.0.1:9", "--lens", str(lens), "--work", str(tmp_path / "w"))
    assert done.returncode != 0 and "--lens reads laya checkpoints" in done.stderr


def test_order_sensitivity_is_measured_and_x_order_removes_it(data, checkpoint_dir, tmp_path):
    """Per method, the largest change of an option's probability when the options are reversed, as
    this test recomputes it from the kept answers; with `--order both` a choice reads both orders, so
    reversing the list changes nothing."""
    method = f"{checkpoint_dir}:torch"
    plain, both = tmp_path / "plain.json", tmp_path / "both.json"
    done = run_cli(str(data), "-m", method, "--order-sensitivity", "--json", str(plain))
    assert done.returncode == 0, done.stderr
    found = json.loads(plain.read_text())["methods"][method]["order_sensitivity"]
    records = read_records(data)
    kept = jsonl.outcomes(tmp_path / "plain.work" / f"{evaluation.parse_method(method).slug}.jsonl")
    changes = []
    for record in records:
        a = kept[evaluation.key_of(record)]["response"]["answers"]["team"]["probabilities"]
        b = kept[evaluation.key_of(evaluation.reversed_record(record))]["response"]["answers"]["team"]["probabilities"]
        changes.append(max(abs(a[k] - b[k]) for k in TEAMS))
    assert found["questions"] == len(STATES) and found["max"] == pytest.approx(max(changes)) and max(changes) > 1e-4
    assert found["mean"] == pytest.approx(sum(changes) / len(changes)) and "order sensitivity" in done.stdout
    done = run_cli(str(data), "-m", method, "--order", "both", "--order-sensitivity", "--json", str(both))
    assert done.returncode == 0, done.stderr
    rep = json.loads(both.read_text())
    assert rep["order"] == "both" and rep["methods"][method]["order_sensitivity"]["max"] < 1e-6
    assert run_cli(str(data), "-m", method, "--order", "sideways").returncode == 2
