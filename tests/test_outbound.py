"""Keys go only where they were given (laya/apps/outbound.py): a URL a command names is sent its own key, from
its own option, never `LAYA_API_KEY` (the key `laya serve` guards itself with); no key crosses the
network in clear; and what such a server answers is read up to a cap."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from laya.apps import outbound
from laya.cli import main
from laya.errors import LayaError

QUESTIONS = {"u": {"type": "noul", "instructions": "Urgent?"},
             "team": {"type": "choice", "instructions": "Team?", "criteria": {"billing": None, "sales": None}}}


class Recorder:
    """A System One server on loopback that answers every question and records each request's
    Authorization header; `padding` bytes of extra answer make it too large to read."""

    def __init__(self, padding: int = 0):
        self.seen: list[str | None] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.seen.append(self.headers.get("Authorization"))
                choice = {"type": "choice", "choice": "billing", "probabilities": {"billing": 0.6, "sales": 0.4}}
                answers = {qid: {"type": "noul", "noul": 0.7} if q["type"] == "noul" else choice
                           for qid, q in body["questions"].items()}
                data = json.dumps({"model": "m", "answers": answers, "usage": {"input_tokens": 3, "output_tokens": 0},
                                   "x_padding": "x" * padding}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


def lines(path, n: int = 3):
    path.write_text("".join(json.dumps({"state": f"s{i}", "questions": QUESTIONS}) + "\n" for i in range(n)))
    return path


def key_file(path, key: str):
    path.write_text(key + "\n")
    return str(path)


def test_predict_url_sends_only_the_key_given_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYA_API_KEY", "the-servers-own-key")
    with Recorder() as server:
        assert main(["predict", "--url", server.url, "-i", str(lines(tmp_path / "in.jsonl")),
                     "-o", str(tmp_path / "a.jsonl"), "--no-progress"]) == 0
        assert server.seen == [None] * 3  # LAYA_API_KEY is not sent anywhere
        assert main(["predict", "--url", server.url, "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "b.jsonl"),
                     "--api-key-file", key_file(tmp_path / "k", "sk-for-this-url"), "--no-progress"]) == 0
        assert server.seen[3:] == ["Bearer sk-for-this-url"] * 3


def test_eval_sends_each_url_its_own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYA_API_KEY", "the-servers-own-key")
    data = tmp_path / "labelled.jsonl"
    data.write_text("".join(json.dumps({"state": f"s{i}", "questions": QUESTIONS,
                                        "labels": {"u": True, "team": "billing"}}) + "\n" for i in range(2)))
    with Recorder() as first, Recorder() as second:
        code = main(["eval", str(data), "-m", first.url, "-m", second.url, "--url-key",
                     f"{first.url}={key_file(tmp_path / 'k1', 'sk-first')}", "--work", str(tmp_path / "w"),
                     "--no-progress"])
        assert code == 0
        assert first.seen == ["Bearer sk-first"] * 2 and second.seen == [None] * 2
    assert main(["eval", str(data), "-m", "http://127.0.0.1:9", "--url-key", "http://elsewhere:1=k",
                 "--no-progress"]) == 2  # a key for a URL no method names


def test_distill_sends_the_teacher_its_own_key_only(tmp_path, monkeypatch):
    from laya.apps.distill import collect, read_states

    monkeypatch.setenv("LAYA_API_KEY", "the-servers-own-key")
    states = read_states(lines(tmp_path / "states.jsonl", 2), QUESTIONS)
    with Recorder() as teacher:
        collect(states, QUESTIONS, teacher.url, tmp_path / "out", api_key=None, concurrency=1, progress=False)
        assert teacher.seen == [None, None]
    assert main(["distill", str(lines(tmp_path / "s.jsonl")), "--teacher", "some.gguf", "--student", "x", "-q",
                 json.dumps(QUESTIONS), "--out", str(tmp_path / "o"), "--teacher-key", str(tmp_path / "k")]) == 2


@pytest.mark.parametrize(("url", "refused"), [
    ("http://10.0.0.5:8000", True), ("http://laya.example.com", True), ("https://laya.example.com", False),
    ("http://127.0.0.1:8000", False), ("http://localhost:8000", False), ("http://[::1]:8000", False),
])
def test_a_key_crosses_the_network_only_over_tls(url, refused):
    if refused:
        with pytest.raises(LayaError, match="over plain http"):
            outbound.check_key_transport(url, "sk", "--api-key-file")
    else:
        outbound.check_key_transport(url, "sk", "--api-key-file")
    outbound.check_key_transport(url, None, "--api-key-file")  # no key: nothing to protect


def test_a_remote_key_over_plain_http_is_refused_before_anything_is_sent(tmp_path, capsys):
    code = main(["predict", "--url", "http://10.255.255.1:9", "-i", str(lines(tmp_path / "in.jsonl")),
                 "-o", str(tmp_path / "o.jsonl"), "--api-key-file", key_file(tmp_path / "k", "sk"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "refusing to send the key" in err and "sk" not in err.split(":")[-1]


def test_an_answer_past_the_cap_is_refused(tmp_path, monkeypatch):
    from laya.apps import jsonl

    monkeypatch.setattr(outbound, "MAX_RESPONSE_BYTES", 4096)
    with Recorder(padding=10_000) as big, Recorder() as small:
        answer = jsonl.remote_answer(big.url, None, concurrency=1)
        (out,) = answer([jsonl.Line(1, 1, {"state": "x", "questions": QUESTIONS})])
        answer.close()
        assert out["error"]["status"] == 502 and "more than 4096 bytes" in out["error"]["message"]
        answer = jsonl.remote_answer(small.url, None, concurrency=1)
        (fine,) = answer([jsonl.Line(1, 1, {"state": "x", "questions": QUESTIONS})])
        answer.close()
        assert fine["response"]["answers"]["u"]["noul"] == 0.7
