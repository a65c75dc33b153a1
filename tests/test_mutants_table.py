"""The mutation check's table is only worth something while every mutant still plants: a snippet
moved or rewritten by a refactor fails CI at its very end (after the suite). Checked here, in
seconds, so a stale mutant is red where the refactor is made."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("laya_mutants_table", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_mutant_plants_once_and_names_tests_that_exist():
    mutants = _mutants()
    stale = []
    for mutant in mutants.MUTANTS:
        path = ROOT / mutant.file
        count = path.read_text(encoding="utf-8").count(mutant.original) if path.exists() else "no file"
        if count != 1:
            stale.append(f"{mutant.name}: snippet found {count} times in {mutant.file}")
        stale += [f"{mutant.name}: no test file {node}" for node in mutant.tests
                  if not (ROOT / node.split("::")[0]).exists()]
    assert not stale, "\n".join(stale)
    assert set(mutants.CI) <= {m.name for m in mutants.MUTANTS}
