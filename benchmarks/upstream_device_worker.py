"""Runs INSIDE the upstream virtual environment for `benchmarks/gpu.py` (never imported by laya: upstream has
the same import name).

Loads one checkpoint with upstream's Agent on the given device (its own precision policy there: bf16
autocast on a GPU of compute capability 8 or later), then answers timing jobs read one JSON line at a
time on stdin and writes {"ms": [each timed call, in ms]} per job:
- {"state": ..., "questions": ..., "warmup": n, "repeats": n}: `Agent.system_one`, one decision;
- {"states": [...], "questions": ..., "warmup": n, "repeats": n}: `Agent.predict_batch`, one call for all.
A GPU is synchronised after every call, so a time is the answer's, not the launch's.
"""

import json
import sys
import time

import laya.agent as upstream
import torch


def main(path: str, device: str, threads: int) -> None:
    if threads:  # 0: torch's default
        torch.set_num_threads(threads)
    agent = upstream.Agent(path, device=device)
    on_gpu = str(getattr(agent, "device", device)).startswith("cuda")
    print(json.dumps({"ready": True, "torch": torch.__version__, "device": str(getattr(agent, "device", device)),
                      "dtype": str(getattr(agent, "dtype", None))}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        times = []
        for i in range(job.get("warmup", 0) + job.get("repeats", 1)):
            started = time.perf_counter()
            if "states" in job:
                agent.predict_batch(job["states"], job["questions"])
            else:
                agent.system_one(job["state"], job["questions"])
            if on_gpu:
                torch.cuda.synchronize()
            if i >= job.get("warmup", 0):
                times.append((time.perf_counter() - started) * 1000)
        print(json.dumps({"ms": times}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
