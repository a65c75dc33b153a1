"""The container images' files say what the deploy docs promise (the image itself is built and run by
scripts/container-check.sh, which needs root, podman and minutes: run before a release, not in CI)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "deploy" / "Containerfile", ROOT / "deploy" / "Containerfile.cuda"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    final = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return [tuple(line.split(None, 1)) if " " in line else (line, "") for line in lines[final:]]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_image_runs_the_wheel_as_its_own_user_with_the_key_from_a_file(path):
    final = instructions(path)
    kinds = [k for k, _ in final]
    assert ("USER", "laya") in final and kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
    entry = json.loads(dict(final)["ENTRYPOINT"])
    assert entry[:2] == ["laya", "serve"] and entry[entry.index("--api-key-file") + 1].startswith("/run/secrets/")
    assert "0.0.0.0" in entry and "--api-key" not in entry
    assert "/ready" in dict(final)["HEALTHCHECK"] and dict(final)["STOPSIGNAL"] == "SIGTERM"
    text = path.read_text(encoding="utf-8")
    assert "COPY . " not in text and "COPY dist/" in text  # the wheel, never the checkout
    assert "laya prepare /models/default" in text


def test_the_scripts_parse():
    for script in ("build-image.sh", "container-check.sh"):
        run = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
