"""Runs INSIDE the upstream virtual environment for `benchmarks/vs_upstream.py` (never imported by laya:
upstream has the same import name).

Loads one checkpoint with upstream's Agent (CPU, fp32, the given thread count), then answers timing
jobs read one JSON line at a time on stdin: {"state": ..., "questions": ...} (optionally "warmup" and
"repeats" counts) and writes {"ms": [each timed call, in ms]} per job, so the caller interleaves
upstream's calls with its own in one run (the two processes never compute at the same time).
"""

import json
import sys
import time

import laya.agent as upstream
import torch


def main(path: str, threads: int) -> None:
    torch.set_num_threads(threads)
    agent = upstream.Agent(path, device="cpu")
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        times = []
        for i in range(job.get("warmup", 0) + job.get("repeats", 1)):
            started = time.perf_counter()
            agent.system_one(job["state"], job["questions"])
            if i >= job.get("warmup", 0):
                times.append((time.perf_counter() - started) * 1000)
        print(json.dumps({"ms": times}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
