"""Make the golden files: generate the golden checkpoints, run upstream laya on every case, record.

    .venv/bin/python tests/golden/make_golden.py [--upstream-venv DIR]

Upstream (`laya==0.4.15` from the package index) runs in its own virtual environment, created on
first use (it has our import name, so it can never share ours). It gets a copy of each checkpoint
because it rewrites `tokenizer_config.json` in place. The result, `answers.json`, holds every
case's input and upstream's unrounded answers and rows; `tests/test_golden.py` replays it.
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

from cases import cases  # noqa: E402

from laya.encoder.tokenizer import Tokenizer  # noqa: E402
from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint  # noqa: E402

UPSTREAM = "laya==0.4.15"
TORCH = "torch==2.13.0"
GOLDEN_SPECS = {
    "modernbert": TestCheckpointSpec(flavour="modernbert", seed=7),
    "mmbert": TestCheckpointSpec(flavour="mmbert", seed=11),
}


def ensure_upstream(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", TORCH, UPSTREAM], check=True)
    return python


def run_on_golden_copies(python: Path, runner: str, cases: list[dict]) -> tuple[dict, dict]:
    """Run `runner` (a script for upstream's venv: argv job.json out.json) on copies of both committed
    golden checkpoints (upstream rewrites tokenizer_config.json in place), each asked `cases`; the
    job it was given and what it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        job: dict = {"checkpoints": {}}
        for name in ("modernbert", "mmbert"):
            copy = Path(tmp) / name
            shutil.copytree(HERE / "checkpoints" / name, copy)
            job["checkpoints"][name] = {"path": str(copy), "cases": cases}
        job_file, out_file, script = Path(tmp) / "job.json", Path(tmp) / "out.json", Path(tmp) / "run.py"
        job_file.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
        script.write_text(runner, encoding="utf-8")
        subprocess.run([str(python), str(script), str(job_file), str(out_file)], check=True)
        return job, json.loads(out_file.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-venv", type=Path, default=HERE.parents[1] / ".venv-upstream")
    args = parser.parse_args()
    python = ensure_upstream(args.upstream_venv)
    with tempfile.TemporaryDirectory() as tmp:
        job: dict = {"checkpoints": {}}
        for name, spec in GOLDEN_SPECS.items():
            folder = HERE / "checkpoints" / name
            if folder.exists():
                shutil.rmtree(folder)
            write_test_checkpoint(folder, spec)
            copy = Path(tmp) / name
            shutil.copytree(folder, copy)
            tok = Tokenizer.from_dir(folder / "tokenizer")
            job["checkpoints"][name] = {"path": str(copy), "cases": cases(tok.mask_token, tok.sep_token)}
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
        subprocess.run([str(python), str(HERE / "run_upstream.py"), str(job_file), str(out_file)], check=True)
        out = json.loads(out_file.read_text(encoding="utf-8"))
    records = []
    for name, spec in job["checkpoints"].items():
        for case, result in zip(spec["cases"], out["results"][name]):
            assert case["id"] == result["id"]
            records.append({"checkpoint": name, **case, **{k: v for k, v in result.items() if k != "id"}})
    golden = {"upstream": out["upstream"], "checkpoints": {n: f"checkpoints/{n}" for n in GOLDEN_SPECS},
              "cases": records}
    (HERE / "answers.json").write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in r for r in records)
    print(f"{len(records)} cases recorded ({errors} refused by upstream) -> {HERE / 'answers.json'}")


if __name__ == "__main__":
    main()
