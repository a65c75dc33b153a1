"""The suite's skip guards: a dependency that CI installs is a failure there, never a skip."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import missing, need

TESTS = Path(__file__).parent


def test_a_missing_dependency_skips_here_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="laya_no_such_module"):
        need("laya_no_such_module")
    with pytest.raises(pytest.skip.Exception, match="chromium"):
        missing("chromium is not installed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must install this, not skip it: .*laya_no_such_module"):
        need("laya_no_such_module")
    with pytest.raises(pytest.fail.Exception, match="CI must install this, not skip it: chromium"):
        missing("chromium is not installed")
    assert need("json").dumps([]) == "[]"


def test_every_skip_goes_through_the_guard():
    """No test skips on its own for a missing dependency: `need`/`missing` (conftest) fail under CI.
    What stays a plain skip is bound to a platform (a `skipif` on `sys.platform`), and says why."""
    bare = re.compile(r"pytest\.importorskip\(|pytest\.skip\(|pytest\.mark\.skipif\((?!sys\.platform)")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(TESTS.glob("*.py")) if path.name != "conftest.py"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if bare.search(line) and path.name != Path(__file__).name]
    assert not found, found
