"""`laya predict -i in.jsonl -o out.jsonl` (issue 28, part 2): one output line per input line, in
order; a bad line is an error naming its problem while the run goes on (exit 1); a stopped run
resumes; `--url` sends the lines to a running server, bounded in flight, honouring Retry-After."""

from __future__ import annotations

import json
import threading

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from live_server import LiveServer

from laya.apps import jsonl
from laya.cli import main
from laya.encoder.engine import EncoderEngine
from laya.server.app import ServerConfig, create_app

QUESTIONS = {"urgent": {"type": "noul", "instructions": "Urgent?"},
             "team": {"type": "choice", "instructions": "Which team?",
                      "criteria": {"billing": "refunds", "sales": None, "support": "bugs"}}}
OWN = {"mood": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "angry"]}}
GOOD = [{"id": "a", "state": "I was charged twice, refund me today"},
        "the app crashes when I open it",  # a bare string is a state
        {"id": 7, "state": "how much is the team plan?", "questions": OWN},
        {"state": {"subject": "refund", "body": "still waiting"}},
        {"id": "long", "state": "refund " * 400, "x_overflow": "keep_end"}]
BAD = [("{not json", "not JSON"),
       ([1, 2], "a line is a request object"),
       ({"id": "q", "state": "x", "questions": {"u": {"type": "maybe", "instructions": "?"}}}, "questions.u"),
       ({"id": "a", "state": "again"}, "repeats line 1"),
       ({"id": "m", "model": "elsewhere", "state": "x"}, "not 'elsewhere'"),
       ({"id": True, "state": "x"}, "id must be"),
       ({"id": "nostate"}, "state")]


def write_input(path, lines) -> None:
    text = []
    for line in lines:
        text.append(line if isinstance(line, str) and line.startswith("{not") else json.dumps(line))
    path.write_text("\n".join(text[:3]) + "\n\n" + "\n".join(text[3:]) + "\n", encoding="utf-8")  # a blank line too


def mixed() -> list:
    out = []
    for i, good in enumerate(GOOD):
        out.append(good)
        if i < len(BAD):
            out.append(BAD[i][0])
    return out + [b for b, _ in BAD[len(GOOD):]]


def read_output(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def expected(model, line) -> dict:
    body = {"state": line} if isinstance(line, str) else line
    return model.predict(body["state"], body.get("questions", QUESTIONS), overflow=body.get("x_overflow"))


def same_answers(got: dict, want: dict) -> None:
    assert got["answers"].keys() == want["answers"].keys()
    for qid, answer in want["answers"].items():
        mine = got["answers"][qid]
        if "probabilities" in answer:
            assert mine["probabilities"] == pytest.approx(answer["probabilities"], abs=1e-5), qid
        else:
            assert mine["noul"] == pytest.approx(answer["noul"], abs=1e-5), qid
    assert got["usage"] == want["usage"]


@pytest.fixture(scope="module")
def run_local(tmp_path_factory, checkpoint_dir, model):
    folder = tmp_path_factory.mktemp("jsonl")
    source, out = folder / "in.jsonl", folder / "out.jsonl"
    (folder / "q.json").write_text(json.dumps(QUESTIONS))
    write_input(source, mixed())
    code = main(["predict", "-m", str(checkpoint_dir), "-r", "torch", "-i", str(source), "-o", str(out),
                 "-q", f"@{folder / 'q.json'}", "--no-progress"])
    return folder, source, out, code


def test_every_line_gets_one_answer_in_order(run_local, model):
    folder, source, out, code = run_local
    assert code == 1  # some lines failed
    lines = mixed()
    got = read_output(out)
    assert len(got) == len(lines)
    assert [g["line"] for g in got] == sorted(g["line"] for g in got)  # input order; the blank line skipped
    goods = [g for g in got if "response" in g]
    assert len(goods) == len(GOOD)
    for record, line in zip(goods, GOOD):
        if isinstance(line, dict) and "id" in line:
            assert record["id"] == line["id"]
        else:
            assert record["id"] == record["line"]  # no id: the line number
        same_answers(record["response"], expected(model, line))
    assert goods[-1]["response"]["x_usage"]["state_tokens_dropped"] > 0  # keep_end took effect


def test_a_bad_line_names_its_problem(run_local):
    _, _, out, _ = run_local
    errors = [g for g in read_output(out) if "error" in g]
    assert len(errors) == len(BAD)
    for record, (_, words) in zip(errors, BAD):
        assert words in record["error"]["message"], record
        assert 400 <= record["error"]["status"] < 500 and len(json.dumps(record)) < 2000


def test_a_stopped_run_resumes_where_it_stopped(run_local, checkpoint_dir):
    folder, source, out, _ = run_local
    whole = out.read_text(encoding="utf-8")
    kept = whole.splitlines(keepends=True)[:4]
    resumed = folder / "resumed.jsonl"
    resumed.write_text("".join(kept) + '{"id": "torn", "li', encoding="utf-8")  # killed mid-write
    code = main(["predict", "-m", str(checkpoint_dir), "-r", "torch", "-i", str(source), "-o", str(resumed),
                 "-q", json.dumps(QUESTIONS), "--no-progress"])
    assert code == 1
    first, again = read_output(out), read_output(resumed)
    assert [r["line"] for r in again] == [r["line"] for r in first]
    for a, b in zip(first, again):
        assert a.keys() == b.keys() and a["id"] == b["id"]
        if "response" in a:
            same_answers(b["response"], a["response"])
    # a finished run resumed does nothing
    assert main(["predict", "-m", str(checkpoint_dir), "-r", "torch", "-i", str(source), "-o", str(resumed),
                 "-q", json.dumps(QUESTIONS), "--no-progress"]) == 0
    assert resumed.read_text(encoding="utf-8") == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in again)


def test_url_sends_the_lines_to_a_running_server(run_local, model):
    folder, source, out, _ = run_local
    remote = folder / "remote.jsonl"
    with LiveServer(create_app(lambda: [EncoderEngine(model)], ServerConfig())) as live:
        code = main(["predict", "--url", live.url, "-i", str(source), "-o", str(remote), "-q", json.dumps(QUESTIONS),
                     "--concurrency", "3", "--no-progress"])
    assert code == 1
    here, there = read_output(out), read_output(remote)
    assert [r["line"] for r in there] == [r["line"] for r in here]
    for a, b in zip(here, there):
        assert a["id"] == b["id"] and ("response" in a) == ("response" in b), (a, b)
        if "response" in a:
            same_answers(b["response"], a["response"])
        elif a["error"]["type"] != "unknown_model":  # the server names its own models
            assert b["error"]["status"] == a["error"]["status"], (a, b)


def test_url_honours_retry_after_and_bounds_what_is_in_flight(tmp_path):
    app = FastAPI()
    seen = {"calls": 0, "now": 0, "most": 0}
    lock = threading.Lock()
    gate = threading.Event()

    @app.get("/ready")
    def ready():
        return {"ready": True}

    @app.post("/v1/systemone")
    def answer(body: dict):
        with lock:
            seen["calls"] += 1
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            first = seen["calls"] <= 2
        gate.wait(0.05)
        with lock:
            seen["now"] -= 1
        if first:
            return JSONResponse({"detail": {"error_type": "rate_limit_error", "message": "busy"}}, status_code=429,
                                headers={"Retry-After": "0"})
        return {"model": "m", "answers": {}, "usage": {"input_tokens": 1, "output_tokens": 0},
                "echo": body["state"]}

    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"id": i, "state": f"s{i}", "questions": QUESTIONS}) + "\n"
                              for i in range(20)))
    with LiveServer(app) as live:
        answer_fn = jsonl.remote_answer(live.url, None, concurrency=2)
        try:
            tally = jsonl.run(jsonl.read_lines(source, None), out, answer_fn, total=20, progress=False)
        finally:
            answer_fn.close()
    got = read_output(out)
    assert tally.answered == 20 and tally.failed == 0
    assert [g["response"]["echo"] for g in got] == [f"s{i}" for i in range(20)]
    assert seen["calls"] == 22 and seen["most"] <= 2


def test_flags_that_do_not_fit_are_usage_errors(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('"x"\n')
    assert main(["predict", "-i", str(source), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "--model is required" in capsys.readouterr().err
    assert main(["predict", "-m", "x", "-i", str(source), "-o", str(tmp_path / "o.jsonl"), "-s", "text"]) == 2
    assert "per request" in capsys.readouterr().err
    assert main(["predict", "-m", "x", "-s", "t", "-q", "{}", "--url", "http://127.0.0.1:1"]) == 2
    assert "JSONL run" in capsys.readouterr().err
    assert main(["predict", "-m", "x", "-i", str(source), "-o", str(source)]) == 2


def test_progress_shows_rate_and_eta():
    import io

    stream = io.StringIO()
    bar = jsonl.Progress(10, stream)
    bar.last -= 10  # due
    bar.step(False)
    bar.show(final=True)
    text = stream.getvalue()
    assert "1/10 lines" in text and "lines/s" in text and "ETA" in text
