"""Make `caller.json`: upstream laya's schema decisions, long-state scans and calibration files.

    .venv/bin/python tests/golden/make_caller_golden.py [--upstream-venv DIR]

Upstream runs in its own virtual environment (`make_golden.ensure_upstream`) on copies of the
checkpoints `make_golden.py` wrote (it rewrites `tokenizer_config.json` in place). The calibration
files go to `calibration/`: hand-written ones, malformed ones, the one upstream fits and saves, and
the one `laya calibrate --format upstream` writes here for upstream to load. The result holds
each case's input and upstream's output as upstream reports it; `tests/test_caller_golden.py`
replays it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from caller_cases import (  # noqa: E402
    CAL_GATES,
    CAL_QUESTIONS,
    CAL_STATES,
    HAND_FILE,
    MALFORMED_FILES,
    VERSION_1_FILE,
    calibration_records,
    long_cases,
    schema_cases,
)
from make_golden import GOLDEN_SPECS, ensure_upstream  # noqa: E402

FIT_MIN_BUCKET = 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-venv", type=Path, default=HERE.parents[1] / ".venv-upstream")
    args = parser.parse_args()
    python = ensure_upstream(args.upstream_venv)
    schema, long = schema_cases(), long_cases()
    files = HERE / "calibration"
    if files.exists():
        shutil.rmtree(files)
    files.mkdir()
    records = files / "records.jsonl"
    records.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in calibration_records()),
                       encoding="utf-8")
    common = {"hand": files / "hand.json", "version-1": files / "version-1.json"}
    common["hand"].write_text(json.dumps(HAND_FILE, indent=2) + "\n", encoding="utf-8")
    common["version-1"].write_text(json.dumps(VERSION_1_FILE, indent=2) + "\n", encoding="utf-8")
    malformed = {}
    for name, body in MALFORMED_FILES.items():
        malformed[name] = files / f"malformed-{name}.json"
        malformed[name].write_text(json.dumps(body) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        job: dict = {"checkpoints": {}, "schema": schema, "long": long, "calibration": {
            "records": calibration_records(), "common_files": {k: str(v) for k, v in common.items()},
            "malformed": {k: str(v) for k, v in malformed.items()}, "states": CAL_STATES, "gates": CAL_GATES,
            "questions": CAL_QUESTIONS, "fit_min_bucket": FIT_MIN_BUCKET}}
        for name in GOLDEN_SPECS:
            copy = Path(tmp) / name
            shutil.copytree(HERE / "checkpoints" / name, copy)
            ours = files / f"ours-{name}.json"  # `laya calibrate --format upstream`, for upstream to load
            subprocess.run([sys.executable, "-m", "laya.cli", "calibrate", str(copy), str(records), "-r", "torch",
                            "--format", "upstream", "--binning", "--binning-min-bucket", str(FIT_MIN_BUCKET),
                            "--min-bucket", "20", "--out", str(ours)], check=True, capture_output=True)
            job["checkpoints"][name] = {"path": str(copy), "ours": str(ours),
                                        "written": str(files / f"upstream-{name}.json")}
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
        subprocess.run([str(python), str(HERE / "run_upstream_caller.py"), str(job_file), str(out_file)], check=True)
        out = json.loads(out_file.read_text(encoding="utf-8"))
    golden = {"upstream": out["upstream"], "checkpoints": {n: f"checkpoints/{n}" for n in GOLDEN_SPECS},
              "schema": schema, "long": long, "calibration": {
                  "records": "calibration/records.jsonl", "states": CAL_STATES, "gates": CAL_GATES,
                  "questions": CAL_QUESTIONS, "fit_min_bucket": FIT_MIN_BUCKET,
                  "files": {"hand": "calibration/hand.json", "version-1": "calibration/version-1.json"},
                  "malformed": {k: f"calibration/malformed-{k}.json" for k in MALFORMED_FILES}},
              "results": out["results"]}
    (HERE / "caller.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(schema)} schema and {len(long)} long-state cases on {len(GOLDEN_SPECS)} checkpoints -> "
          f"{HERE / 'caller.json'}")


if __name__ == "__main__":
    main()
