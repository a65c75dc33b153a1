"""docs/performance.md is made from the benchmarks' JSON records, never edited by hand: it must be what
benchmarks/performance_doc.py renders from benchmarks/results/ now, and every record must say the
processor it ran on and the command that made it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_performance_document_is_generated_from_the_records():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "performance_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_record_names_its_processor_and_command():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from performance_doc import records

    found = records()
    assert found, "no benchmark record in benchmarks/results/"
    for record in found:
        assert record["processor"]["kind"] and record["processor"]["described"]
        assert record["command"].startswith("python benchmarks/") and "/tmp" not in record["command"]
