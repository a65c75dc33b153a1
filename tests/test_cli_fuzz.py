"""The command line holds like the server: generated input of every shape (tests/generators.py) to
`laya decide` (schemas), `laya predict -i` (request lines) and `laya eval` (labelled lines). A bad input is
one `laya: error:` line and exit status 2, or (in a JSONL run) that line's error object; never a traceback."""

from __future__ import annotations

import json

import pytest
from generators import question, request, schema, texts, values
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laya.cli import common, main


@pytest.fixture
def quick(monkeypatch, model):
    """Every command's model is the session's (loading the tiny checkpoint again per example costs more
    than the example)."""
    monkeypatch.setattr(common, "load_model", lambda args: model)
    from laya.encoder.engine import EncoderEngine

    monkeypatch.setattr(common, "make_engine", lambda args: EncoderEngine(model))


def one_clean_line(code: int, err: str, failed_lines: bool = False) -> None:
    """Exit 0 (or 1 for a JSONL run with failed lines, which says so), or 2 with one error line."""
    assert code in ((0, 1, 2) if failed_lines else (0, 2)), (code, err)
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        errors = [line for line in err.splitlines() if line.startswith("laya: error:")]
        assert len(errors) == 1, err


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(state=st.text(min_size=1, max_size=40), given_schema=schema | values)
def test_decide_with_any_schema(quick, capsys, state, given_schema):
    code = main(["decide", "-m", "x", f"--state={state}", f"--schema={json.dumps(given_schema)}"])
    one_clean_line(code, capsys.readouterr().err)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(request | values | st.text(max_size=20), min_size=1, max_size=8),
       raw=st.lists(st.text(max_size=30), max_size=3))
def test_predict_lines_of_any_shape(quick, capsys, tmp_path_factory, lines, raw):
    folder = tmp_path_factory.mktemp("lines")
    source, out = folder / "in.jsonl", folder / "out.jsonl"
    text = "".join(json.dumps(line) + "\n" for line in lines) + "".join(r.replace("\n", " ") + "\n" for r in raw)
    source.write_text(text, encoding="utf-8", errors="surrogatepass")
    code = main(["predict", "-m", "x", "-i", str(source), "-o", str(out), "--no-progress",
                 "-q", json.dumps({"u": {"type": "noul", "instructions": "Urgent?"}})])
    err = capsys.readouterr().err
    one_clean_line(code, err, failed_lines=True)
    if code != 2:  # one answer or error object per line, in order
        # lines are split on "\n" alone (str.splitlines would split on NEL and the like inside a string too)
        written = [json.loads(line) for line in out.read_text(encoding="utf-8").split("\n") if line]
        assert len(written) == len([x for x in text.split("\n") if x.strip()])
        assert all("error" in w or "response" in w for w in written)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(records=st.lists(st.fixed_dictionaries({}, optional={
    "state": texts | values, "questions": st.dictionaries(st.text(max_size=5), question, max_size=2) | values,
    "labels": values, "tags": values, "lang": values}) | values, min_size=1, max_size=4))
def test_eval_refuses_a_bad_labelled_line_naming_it(capsys, tmp_path_factory, records):
    data = tmp_path_factory.mktemp("eval") / "labelled.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8", errors="surrogatepass")
    code = main(["eval", str(data), "-m", "http://127.0.0.1:9", "--no-progress", "--work",
                 str(data.parent / "w")])
    err = capsys.readouterr().err
    assert code in (0, 1, 2) and "Traceback" not in err, err[-2000:]
