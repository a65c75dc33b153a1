"""What the server says about itself carries names and digests, never its file system or processes
(laya/redaction.py): paths inside any text shortened to their last part, pid and path fields left out."""

from __future__ import annotations

import pytest

from laya.redaction import redact, redacted


@pytest.mark.parametrize(("text", "shown"), [
    ("laya checkpoint /home/ana/models/laya", "laya checkpoint laya"),
    ("/srv/x/ckpt: not a checkpoint folder", "ckpt: not a checkpoint folder"),
    ("No such file: '/root/my models/chat.gguf'", "No such file: 'chat.gguf'"),
    ("~/models/x.gguf read by its answer-slot readout", "x.gguf read by its answer-slot readout"),
    ("C:\\models\\laya could not be read", "laya could not be read"),
    ("owner/repo on the Hub", "owner/repo on the Hub"),  # relative: no host layout in it
    ("served at http://127.0.0.1:8000/v1", "served at http://127.0.0.1:8000/v1"),
    ("3/4 of the rows", "3/4 of the rows"),
])
def test_paths_become_their_last_part(text, shown):
    assert redact(text) == shown


def test_pid_and_path_fields_are_left_out_everywhere():
    health = {"models": {"m": {"process": 4242, "pid": 4242, "path": "/a/b", "source": "/data/ckpt",
                               "status": {"last_death": {"pid": 7, "reason": "killed at /x/y"}}}},
              "load_errors": ["OSError: /opt/m.gguf: truncated"]}
    out = redacted(health)
    assert out == {"models": {"m": {"source": "ckpt", "status": {"last_death": {"reason": "killed at y"}}}},
                   "load_errors": ["OSError: m.gguf: truncated"]}


def test_a_pid_or_a_path_inside_a_dict_inside_a_list_is_redacted_too():
    health = {"workers": [{"pid": 4242, "path": "/srv/models/m", "note": "loaded /srv/models/m.gguf"},
                          ("at /home/u/x.py", {"process": 7, "cwd": "/home/u"})]}
    assert redacted(health) == {"workers": [{"note": "loaded m.gguf"}, ["at x.py", {}]]}
