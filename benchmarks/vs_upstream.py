"""laya against upstream laya 0.4.15 (fp32, torch, the same CPUs), in one interleaved run.

    .venv/bin/python benchmarks/vs_upstream.py [--shape base|small] [-r auto -r torch ...] [--repeats 7] [--memory]

The checkpoint is generated in the exact published format (random weights, so only speed means
anything): by default the full mmBERT-base shape (22 layers, d 768, 12 heads, GeGLU 1152, a 256k
vocabulary, a 128-token sliding window with global attention every third layer). Scenarios, as in
issue 24: one question over a 128-token row, one over a 512-token row, and 4 choice questions over a
300-token state. Upstream runs in its own virtual environment (`.venv-upstream`, the one the golden
tests build) and process; every repeat times upstream, then each of our runtimes, on the same input,
never at the same time, with the same thread count. Reported: medians (min-max) of the whole call
(`Agent.system_one` upstream, `Model.predict` here) and the speed-up over upstream, with the processor.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "golden"))

SHAPES = {
    "base": dict(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                 local_attention=128, max_len=1024, head_max_len=256, vocab_size=256000, seed=3),
    "small": dict(flavour="mmbert", hidden_size=256, num_layers=6, num_heads=4, intermediate_size=384,
                  local_attention=128, max_len=1024, head_max_len=256, seed=3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("-r", "--runtime", action="append", help="our runtimes to time (default: auto)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--upstream-venv", type=Path, default=ROOT / ".venv-upstream")
    parser.add_argument("--memory", action="store_true",
                        help="also each runtime's peak memory: loading it and answering every scenario once, in "
                             "a process of its own (after the timing, its bundles cached)")
    parser.add_argument("--weights", choices=["default", "conditioned"], default="default",
                        help="conditioned: attention logits of spread 1 (the generator's default Wqkv makes the "
                             "base shape's attention one-hot); speed does not depend on it")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import torch
    from laya.models.testgen import TestCheckpointSpec, write_test_checkpoint
    from make_golden import ensure_upstream

    import laya
    from laya.bench import scenarios
    from laya.hardware import cpu

    torch.set_num_threads(args.threads)
    runtimes = args.runtime or ["auto"]
    python = ensure_upstream(args.upstream_venv)
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"attention_logit_std": 1.0, "scorer_gain": 1.0} if args.weights == "conditioned" else {}
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec(**SHAPES[args.shape], **extra))
        copy = Path(tmp) / "upstream-copy"  # upstream rewrites tokenizer_config.json in place
        shutil.copytree(folder, copy)
        worker = subprocess.Popen([str(python), str(HERE / "upstream_worker.py"), str(copy), str(args.threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert worker.stdin and worker.stdout
        ready = json.loads(worker.stdout.readline())

        def upstream(state: str, questions: dict) -> float:
            worker.stdin.write(json.dumps({"state": state, "questions": questions}) + "\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())["ms"][0]

        models = {}
        for spec in runtimes:
            name, _, precision = spec.partition(":")
            options = {"precision": precision} if precision else {}
            started = time.perf_counter()
            models[spec] = laya.load(folder, runtime=name, threads=args.threads, **options)
            how = models[spec].choice.describe() if models[spec].choice else models[spec].runtime.precision
            print(f"loaded {spec} in {time.perf_counter() - started:.1f} s: {how}", flush=True)
        plan = scenarios(next(iter(models.values())), [128, 512], [4], 300)
        rows = []
        for sc in plan:
            prepared = next(iter(models.values())).prepare([sc.state], sc.questions)
            tokens = sum(len(r.ids) for r in prepared.rows[0])
            times: dict[str, list[float]] = {"upstream": [], **{spec: [] for spec in models}}
            for rep in range(args.warmup + args.repeats):
                ms = upstream(sc.state, sc.questions)
                if rep >= args.warmup:
                    times["upstream"].append(ms)
                for spec, model in models.items():
                    started = time.perf_counter()
                    model.predict(sc.state, sc.questions)
                    if rep >= args.warmup:
                        times[spec].append((time.perf_counter() - started) * 1000)
            rows.append((sc.name, tokens, times))
            print(f"  {sc.name}: done", flush=True)
        upstream_peak = _peak_mb(worker.pid)
        worker.stdin.close()
        worker.wait(timeout=30)
        peaks = {spec: _peak_in_own_process(folder, spec, args.threads, plan) for spec in models} if args.memory else {}

    machine = cpu()
    print(f"\nprocessor: {machine.describe()}; {args.threads} threads; shape {args.shape}; "
          f"upstream laya 0.4.15 on torch {ready['torch']}, ours on torch {torch.__version__}")
    names = ["upstream", *models]
    print(f"{'scenario':34s} {'tokens':>6s} " + " ".join(f"{n:>24s}" for n in names))
    for name, tokens, times in rows:
        base = statistics.median(times["upstream"])
        cells = []
        for n in names:
            med = statistics.median(times[n])
            cells.append(f"{med:8.1f} ms ({base / med:4.2f}x)")
        print(f"{name:34s} {tokens:6d} " + " ".join(f"{c:>24s}" for c in cells))
    if peaks:
        print(f"{'peak memory (RSS)':34s} {'':6s} " + " ".join(
            f"{(upstream_peak if n == 'upstream' else peaks[n]):>21.0f} MB" for n in names))


def _peak_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_in_own_process(folder: Path, spec: str, threads: int, plan) -> float:
    """Peak RSS of a fresh process that loads `spec` and answers each scenario once."""
    name, _, precision = spec.partition(":")
    requests = [(sc.state, sc.questions) for sc in plan]
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so a child reports its parent's peak
    code = ("import json, sys, warnings; warnings.simplefilter('ignore'); import laya\n"
            f"m = laya.load({str(folder)!r}, runtime={name!r}, threads={threads}"
            + (f", precision={precision!r}" if precision else "") + ")\n"
            f"for state, questions in json.loads({json.dumps(requests)!r}): m.predict(state, questions)\n"
            "print(next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:'))"
            " / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else float("nan")


if __name__ == "__main__":
    main()
