"""Make the wide-budget goldens: upstream laya 0.4.15 on a generated checkpoint with the mmBERT-base
row budget (`max_len` 1,024, `head_max_len` 256), on questions whose heads crowd that budget.

    .venv/bin/python tests/golden/make_wide_golden.py [--upstream-venv DIR]

The checkpoint is not committed: `laya.testing.checkpoints` makes the same bytes from the same spec (the
golden keeps the spec and the digests of the generated files, and the test checks them). The cases
are code (`wide_cases.py`, some fitted to the tokenizer); the golden keeps a digest of each input.
Upstream runs in its own virtual environment (`make_golden.ensure_upstream`) on a copy of the
checkpoint. Rows are kept compact (length, a digest of the ids, the last tokens, the markers) and
probabilities to 10 decimals, so the file stays small. `tests/test_tournament.py` replays `wide.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_golden import ensure_upstream  # noqa: E402
from wide_cases import input_digest, wide_cases  # noqa: E402

from laya.encoder.tokenizer import Tokenizer  # noqa: E402
from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint  # noqa: E402

SPEC = TestCheckpointSpec(flavour="mmbert", max_len=1024, head_max_len=256, seed=5)
FILES = ("model.safetensors", "tokenizer/tokenizer.json", "rl_agent_config.json", "encoder/config.json")


def ids_digest(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    return {rel: hashlib.sha256((folder / rel).read_bytes()).hexdigest() for rel in FILES}


def compact_rows(rows: list[dict]) -> list[dict]:
    return [{"n": len(r["ids"]), "sha256": ids_digest(r["ids"]), "tail": r["ids"][-8:], "markers": r["markers"]}
            for r in rows]


def compact_answer(answer: dict) -> dict:
    noul = answer["type"] == "noul"
    p = [1.0 - answer["noul"], answer["noul"]] if noul else list(answer["probabilities"].values())
    return {"type": answer["type"], "p": [round(x, 10) for x in p],
            "act": round(answer["action"]["act_probability"], 10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-venv", type=Path, default=HERE.parents[1] / ".venv-upstream")
    args = parser.parse_args()
    python = ensure_upstream(args.upstream_venv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "made", SPEC)
        copy = Path(tmp) / "wide"  # upstream rewrites tokenizer_config.json in place
        shutil.copytree(folder, copy)
        cases = wide_cases(Tokenizer.from_dir(folder / "tokenizer"))
        job = {"checkpoints": {"wide": {"path": str(copy), "cases": cases}}}
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_file.write_text(json.dumps(job, ensure_ascii=False), encoding="utf-8")
        subprocess.run([str(python), str(HERE / "run_upstream.py"), str(job_file), str(out_file)], check=True)
        out = json.loads(out_file.read_text(encoding="utf-8"))
        digests = file_digests(folder)
    records = []
    for case, result in zip(cases, out["results"]["wide"]):
        assert case["id"] == result["id"]
        record = {"id": case["id"], "input_sha256": input_digest(case)}
        if "error" in result:
            record["error"] = result["error"]
        else:
            usage = result["response"]["usage"]
            record["usage"] = {k: usage[k] for k in ("input_tokens", "state_tokens", "state_tokens_dropped")}
            record["answers"] = {qid: compact_answer(a) for qid, a in result["response"]["answers"].items()}
            record["rows"] = compact_rows(result["rows"])
        records.append(record)
    golden = {"upstream": out["upstream"], "spec": dataclasses.asdict(SPEC), "digests": digests, "cases": records}
    text = json.dumps(golden, ensure_ascii=False, separators=(",", ":"))
    (HERE / "wide.json").write_text(text.replace('{"id"', '\n{"id"') + "\n", encoding="utf-8")
    errors = sum("error" in r for r in records)
    print(f"{len(records)} wide cases recorded ({errors} refused by upstream) -> {HERE / 'wide.json'}")


if __name__ == "__main__":
    main()
