"""The README stays a user's document that matches the code: short, every package of `laya/` named in
its layout, every subcommand of the real parser named in its command-line section, no path of the
machine it was written on, and no relative link that leads nowhere. Fast: no model, no subprocess."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 420
MACHINE_PATH = re.compile(r"/(?:work|home|root|check)/")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)  # http:, https:, mailto:, ...


def readme() -> str:
    return README.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of the `## heading` section: up to the next heading of level 2 or above."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip() == f"## {heading}"]
    assert len(starts) == 1, f"README.md needs exactly one '## {heading}' heading, found {len(starts)}"
    body = []
    fenced = False
    for line in lines[starts[0] + 1:]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,2} ", line):
            break
        body.append(line)
    return "\n".join(body)


def packages() -> list[str]:
    """Every package under laya/ (a directory with an __init__.py), as a dotted name."""
    found = sorted(".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "laya").rglob("__init__.py")
                   if "__pycache__" not in init.parts)
    assert "laya" in found
    return found


def subcommands() -> list[str]:
    from laya.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(actions) == 1, "the laya parser should have one set of subcommands"
    names = sorted(actions[0].choices)
    assert names, "the laya parser has no subcommands"
    return names


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short():
    count = len(readme().splitlines())
    assert count <= MAX_LINES, f"README.md has {count} lines; at most {MAX_LINES} (move reference to docs/)"


def test_every_package_is_named_in_the_layout():
    layout = section(readme(), "Layout")
    missing = [name for name in packages() if f"`{name}`" not in layout]
    assert not missing, f"packages not named (as `dotted.name`) in README.md's '## Layout': {missing}"


def test_every_subcommand_is_in_the_command_line_section():
    cli = section(readme(), "Command line")
    missing = [name for name in subcommands() if not re.search(rf"\blaya {re.escape(name)}\b", cli)]
    assert not missing, f"subcommands not shown as `laya NAME` in README.md's '## Command line': {missing}"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_machine_paths(path):
    hits = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not hits, "paths of a machine in the docs:\n" + "\n".join(hits)


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    broken = []
    for target in targets:
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (ROOT / file.lstrip("/")) if file.startswith("/") else (path.parent / file)
        if not resolved.resolve().exists():
            broken.append(target)
    assert not broken, f"relative links in {path.relative_to(ROOT)} that lead to no file: {broken}"
