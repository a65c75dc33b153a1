"""The command line: JSON out, one clear line and exit 2 for user mistakes, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

QUESTIONS = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": None, "sales": None}}}


def laya(*args, stdin: str | None = None, env=None):
    return subprocess.run([sys.executable, "-m", "laya.cli", *map(str, args)], capture_output=True, text=True,
                          input=stdin, env=env, timeout=120)


def test_predict_from_files(checkpoint_dir, tmp_path):
    (tmp_path / "q.json").write_text(json.dumps(QUESTIONS))
    (tmp_path / "state.json").write_text(json.dumps([{"role": "user", "content": "refund please"}]))
    out = laya("predict", "--model", checkpoint_dir, "--state", f"@{tmp_path / 'state.json'}", "--state-json",
               "--questions", f"@{tmp_path / 'q.json'}")
    assert out.returncode == 0, out.stderr
    response = json.loads(out.stdout)
    assert response["answers"]["t"]["choice"] in ("billing", "sales")
    assert response["usage"]["input_tokens"] > 0


def test_predict_state_from_stdin(checkpoint_dir):
    out = laya("predict", checkpoint_dir, "-s", "@-", "-q", json.dumps(QUESTIONS), stdin="refund please")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"] == checkpoint_dir.name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "-m", "/no/such/folder", "-s", "x", "-q", "{}"], "no such checkpoint folder"),
        (["predict", "-m", "{ck}", "-s", "x", "-q", "{bad json"], "--questions: not valid JSON"),
        (["predict", "-m", "{ck}", "-s", "x", "-q", "@/no/file.json"], "--questions: file not found"),
        (["predict", "-m", "{ck}", "-s", "x", "-q", '{"a": {"type": "essay"}}'], "Input tag 'essay' does not match"),
        (["predict", "-m", "{ck}", "-s", "x", "-q", "{}"], "questions must not be empty"),
        (["predict", "-m", "{ck}", "-s", "x", "-q", json.dumps(QUESTIONS), "-r", "tpu"], "unknown runtime"),
    ],
)
def test_user_mistakes_are_one_line(checkpoint_dir, args, message, capsys):
    from laya.cli import main

    assert main([a.replace("{ck}", str(checkpoint_dir)) for a in args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("laya: error:")]
    assert len(errors) == 1 and message in errors[0]


def test_info(checkpoint_dir, capsys):
    from laya.cli import main

    assert main(["info", str(checkpoint_dir)]) == 0
    out = capsys.readouterr()
    assert "4 layers, d 128" in out.out and "max_len 256, head_max_len 96" in out.out
    assert "choice:11+ 0.5" in out.out
    assert "choice:11+=0.1006 -> 0.5" in out.err  # the clamp is announced
    assert main(["info", str(checkpoint_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["encoder"]["rope_theta"] == {"global": 160000.0, "local": 10000.0}


def test_demo_falls_back_to_a_random_model_offline(tmp_path):
    out = laya("demo", "--model", "acme/not-cached", "--demo-dir", tmp_path / "demo")
    assert out.returncode == 0, out.stderr
    assert "RANDOM weights" in out.stderr
    assert set(json.loads(out.stdout)["answers"]) == {"team", "urgent", "anger"}


def test_serve_exits_when_a_model_cannot_load(tmp_path):
    from live_server import free_port

    out = laya("serve", "--model", tmp_path / "missing", "--port", free_port())
    assert out.returncode == 2
    assert "laya: error: could not load the models" in out.stderr and "no such checkpoint folder" in out.stderr
    assert "Traceback" not in out.stderr
