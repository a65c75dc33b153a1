"""Record upstream laya 0.4.15's route for every routing case: `routing.json`.

    .venv/bin/python tests/golden/make_routing_golden.py [--upstream-venv DIR]

Upstream runs in its own virtual environment (it has our import name), created on first use by
`make_golden.ensure_upstream`. Its `Router` is built with its default registry -- repository ids
only, nothing is loaded or downloaded until a model runs -- and only `Router._route` is called, the
decision without inference. The runner is given a JSON job and answers with a JSON file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from make_golden import ensure_upstream  # noqa: E402
from routing_cases import N_GENERATED, SEED, hand  # noqa: E402
from routing_cases import generated as generated_cases  # noqa: E402

RUNNER = '''
import json, sys
import laya
from laya.routing.router import Router

job = json.load(open(sys.argv[1], encoding="utf-8"))
routers = {}
out = []
for case in job["cases"]:
    default = case["default"]
    if default not in routers:
        routers[default] = Router(default=default)
    decision = routers[default]._route(case["state"], lang=case.get("lang"))
    out.append({"id": case["id"], "model": decision.model, "reason": decision.reason})
json.dump({"upstream": laya.__version__, "results": out}, open(sys.argv[2], "w", encoding="utf-8"),
          ensure_ascii=False)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream-venv", type=Path, default=ROOT / ".venv-upstream")
    args = parser.parse_args()
    python = ensure_upstream(args.upstream_venv)
    picked, made = hand(), generated_cases()
    cases = picked + made
    with tempfile.TemporaryDirectory() as tmp:
        job_file, out_file, runner = Path(tmp) / "job.json", Path(tmp) / "out.json", Path(tmp) / "run.py"
        job_file.write_text(json.dumps({"cases": cases}, ensure_ascii=False), encoding="utf-8")
        runner.write_text(RUNNER, encoding="utf-8")
        # run outside the checkout, so `import laya` finds upstream and never our package
        env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        subprocess.run([str(python), str(runner), str(job_file), str(out_file)], check=True, cwd=tmp, env=env)
        out = json.loads(out_file.read_text(encoding="utf-8"))
    records = []
    for i, (case, result) in enumerate(zip(cases, out["results"], strict=True)):
        assert case["id"] == result["id"]
        records.append({**case, "set": "hand" if i < len(picked) else "generated",
                        "model": result["model"], "reason": result["reason"]})
    golden = {"upstream": out["upstream"], "seed": SEED, "generated": N_GENERATED, "cases": records}
    path = HERE / "routing.json"
    path.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(records)} cases ({len(picked)} hand, {len(made)} generated) -> {path}")


if __name__ == "__main__":
    main()
