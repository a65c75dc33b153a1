"""Runs INSIDE the upstream virtual environment (upstream `laya` 0.4.15 installed there).

Reads a job JSON (checkpoint folders and cases), answers each case with upstream's Agent on the
CPU in fp32, and writes what it answered, unrounded, plus the rows it built. Never imported by
our package or tests: upstream has the same import name as ours.
"""

import json
import sys

import laya.agent as upstream
import torch

# Upstream rounds its answers to 4 decimals; the golden keeps full precision to compare at 1e-4.
upstream.round = lambda value, ndigits=None: value


def main(job_path: str, out_path: str) -> None:
    with open(job_path, encoding="utf-8") as handle:
        job = json.load(handle)
    torch.manual_seed(0)
    results = {}
    for name, spec in job["checkpoints"].items():
        agent = upstream.Agent(spec["path"], device="cpu")
        rows = []
        original = agent._encode_state

        def capture(*args, _orig=original, rows=rows, **kwargs):
            items = _orig(*args, **kwargs)
            rows.append([{"ids": list(it["ids"]), "markers": list(it["markers"])} for it in items])
            return items

        agent._encode_state = capture
        out = []
        for case in spec["cases"]:
            rows.clear()
            try:
                response = agent.system_one(case["state"], case["questions"])
                out.append({"id": case["id"], "response": response, "rows": rows[0] if rows else None})
            except Exception as exc:  # recorded: our runtime must refuse the same cases
                out.append({"id": case["id"], "error": f"{type(exc).__name__}: {exc}"})
        results[name] = out
    meta = {"laya": upstream.__dict__.get("__version__") or __import__("laya").__version__,
            "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"upstream": meta, "results": results}, handle, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
