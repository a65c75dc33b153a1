"""The golden cases (laya/encoder/golden_cases.py), loaded by file path: the golden maker imports this in
upstream's environment too, whose own package is named laya."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SOURCE = Path(__file__).resolve().parents[2] / "laya" / "encoder" / "golden_cases.py"
_spec = importlib.util.spec_from_file_location("golden_cases", _SOURCE)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

ANGER, CONVERSATION, LONG_TEXT, ROUTE, TEAMS, URGENT = (_module.ANGER, _module.CONVERSATION, _module.LONG_TEXT,
                                                        _module.ROUTE, _module.TEAMS, _module.URGENT)
cases = _module.cases
