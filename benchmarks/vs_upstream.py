"""laya against upstream laya 0.4.15 (fp32, torch, the same CPUs), in one interleaved run.

    .venv/bin/python benchmarks/vs_upstream.py [--shape base|small] [-r auto -r packed:bf16 ...] [--force]
        [--repeats 7] [--json benchmarks/results/NAME.json]

The checkpoint is generated in the exact published format (random weights): by default the full
mmBERT-base shape (22 layers, d 768, 12 heads, GeGLU 1152, a 256k vocabulary, a 128-token sliding
window with global attention every third layer), with attention logits of spread 1 (`--weights
conditioned`, the default: with the generator's raw weights every attention head is one-hot, a
network on which no reduced precision can stay near fp32, so its gates refuse them; speed does not
depend on it). Scenarios: one question over a 128-token and a 512-token row, 4 choice questions over
a 300-token state and 10 over a 512-token state. Upstream runs in its own virtual environment
(`.venv-upstream`, the one the golden tests build) and process; every repeat times upstream, then each
of our runtimes, on the same input, never at the same time, with the same thread count.

Reported per scenario: medians of the whole call (`Agent.system_one` upstream, `Model.predict` here),
the speed-up over upstream, the matrix floor of the rows on this machine (benchmarks/floor.py; bf16
where the processor has bf16 units, else fp32) and each runtime's ratio to it; per runtime: what auto
chose, its plan and gate, the oneDNN kernels that answered (read from oneDNN's verbose log) and its
peak memory in a process of its own. `--json` writes all of it for `benchmarks/performance_doc.py`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "golden"))
sys.path.insert(0, str(HERE))

SHAPES = {
    "base": dict(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                 local_attention=128, max_len=1024, head_max_len=256, vocab_size=256000, seed=3),
    "small": dict(flavour="mmbert", hidden_size=256, num_layers=6, num_heads=4, intermediate_size=384,
                  local_attention=128, max_len=1024, head_max_len=256, seed=3),
}
CONDITIONED = {"attention_logit_std": 1.0, "scorer_gain": 1.0}


def processor_kind(machine) -> str:
    """The kind of processor a table is for: what decides which precision can be fast on it."""
    if "amx_bf16" in machine.flags:
        return "AMX"
    if machine.bf16_units:
        return "AVX-512 BF16"
    if "avx512f" in machine.flags:
        return "AVX-512"
    return "AVX2" if "avx2" in machine.flags else machine.arch


def plan_scenarios(model) -> list:
    from laya.encoder.bench import Scenario, scenarios

    plan = scenarios(model, [128, 512], [4], 300)
    ten = scenarios(model, [], [10], 512)[0]
    return plan + [Scenario(ten.name, ten.state, ten.questions)]


def load_runtimes(specs: list[str], folder: Path, threads: int, force: bool) -> dict[str, Any]:
    import laya

    models = {}
    for spec in specs:
        name, _, precision = spec.partition(":")
        options: dict[str, Any] = {"precision": precision} if precision else {}
        if name == "auto":  # its pick is stored by the first load; else it is made now, not in the background
            options["background"] = False
        if force and precision and precision not in ("fp32", "f32"):
            options["force"] = True
        started = time.perf_counter()
        models[spec] = laya.load(folder, runtime=name, threads=threads, **options)
        how = models[spec].choice.describe() if models[spec].choice else models[spec].runtime.precision
        print(f"loaded {spec} in {time.perf_counter() - started:.1f} s: {how}", flush=True)
    return models


def time_interleaved(models: dict[str, Any], plan: list, upstream, repeats: int, warmup: int) -> list[dict]:
    out = []
    for sc in plan:
        tokens = sum(len(r.ids) for r in next(iter(models.values())).prepare([sc.state], sc.questions).rows[0])
        times: dict[str, list[float]] = {"upstream": [], **{spec: [] for spec in models}}
        for rep in range(warmup + repeats):
            ms = upstream(sc.state, sc.questions)
            if rep >= warmup:
                times["upstream"].append(ms)
            for spec, model in models.items():
                started = time.perf_counter()
                model.predict(sc.state, sc.questions)
                if rep >= warmup:
                    times[spec].append((time.perf_counter() - started) * 1000)
        out.append({"scenario": sc.name, "tokens": tokens, "questions": len(sc.questions),
                    "medians_ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
                    "min_ms": {k: round(min(v), 2) for k, v in times.items()}})
        print(f"  {sc.name}: done", flush=True)
    return out


def add_floors(results: list[dict], checkpoint, plan: list, model) -> None:
    """Each scenario's matrix floor (its rows' products, summed) and every runtime's ratio to it: in bf16
    where the processor has bf16 units, else in fp32 (bf16 would be emulated there, slower than fp32)."""
    import torch
    from floor import row_floor_ms

    from laya.native.cpu import cpu

    dtype = torch.bfloat16 if cpu().bf16_units else torch.float32
    for result, sc in zip(results, plan):
        rows = model.prepare([sc.state], sc.questions).rows[0]
        floor = round(sum(row_floor_ms(checkpoint, len(r.ids), len(r.markers), dtype=dtype) for r in rows), 2)
        result.update(floor_ms=floor, floor_dtype="bf16" if dtype == torch.bfloat16 else "fp32")
        base = result["medians_ms"]["upstream"]
        result["speedup"] = {k: round(base / v, 3) for k, v in result["medians_ms"].items()}
        result["x_floor"] = {k: round(v / floor, 2) for k, v in result["medians_ms"].items()}


def describe_runtime(model) -> dict[str, Any]:
    info = model.runtime.info()
    gate = info.gate
    return {"runtime": info.name, "precision": info.precision, **info.details,
            "choice": model.choice.describe() if model.choice else None,
            "gate": {k: gate[k] for k in ("max_dp", "flipped_margin", "batch_dependence_max_dp", "passed", "plan")
                     if k in gate} if gate else None}


def in_own_process(folder: Path, spec: str, threads: int, force: bool, plan: list, kernels: bool) -> dict[str, Any]:
    """Peak memory (VmHWM) of a fresh process that loads `spec` (its programs and gates cached by now) and
    answers each scenario once; and the oneDNN kernels that answered."""
    from floor import kernels as onednn_kernels

    name, _, precision = spec.partition(":")
    options = {"threads": threads, **({"precision": precision} if precision else {}),
               **({"force": True} if force and precision and precision not in ("fp32", "f32") else {})}
    requests = [(sc.state, sc.questions) for sc in plan]
    load = (f"import json, sys, warnings; warnings.simplefilter('ignore'); import laya\n"
            f"m = laya.load({str(folder)!r}, runtime={name!r}, **{options!r})\n")
    answer = f"for state, questions in json.loads({json.dumps(requests)!r}): m.predict(state, questions)\n"
    peak = ("print(next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:'))"
            " / 1024)\n")
    out = subprocess.run([sys.executable, "-c", load + answer + peak], capture_output=True, text=True, timeout=3600)
    found: dict[str, Any] = {"peak_mb": round(float(out.stdout.strip().splitlines()[-1]), 1)
                             if out.returncode == 0 else None}
    if kernels:
        found["kernels"] = onednn_kernels(load + "print('LOADED', flush=True)\n" + answer)
    return found


FIRST_LOAD = """
import json, sys, time, warnings
began = time.perf_counter()
warnings.simplefilter("ignore")
import laya
folder, threads, state, questions = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
m = laya.load(folder, threads=threads)
loaded = time.perf_counter()
answer = m.predict(state, questions)
first = time.perf_counter()
print(json.dumps({"load_s": loaded - began, "first_answer_s": first - began,
                  "first_precision": answer.get("x_precision")}), flush=True)
if m.upgrade is not None:
    m.upgrade.wait()
    print(json.dumps({"fast_s": time.perf_counter() - began, "upgrade": m.upgrade.status(),
                      "precision": m.runtime.precision}), flush=True)
"""


def first_load(folder: Path, threads: int, sc) -> dict[str, Any]:
    """A new checkpoint on this machine, as a user meets it: a fresh process (the cache holds nothing of
    this checkpoint) loads it with the default runtime (auto), answers one question (the time to the
    first answer, the process's start included) and waits for auto's background upgrade (the time to
    the fast runtime, whose pick later loads reuse)."""
    env = {**os.environ, "LAYA_AUTO_MEASURE": "1", "LAYA_AUTO_BACKGROUND": "1"}
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", FIRST_LOAD, str(folder), str(threads), sc.state,
                          json.dumps(sc.questions)], capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"the first load failed: {out.stderr[-2000:]}")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    found = {**lines[0], **(lines[1] if len(lines) > 1 else {}), "wall_s": time.perf_counter() - began}
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in found.items()}


def golden_drift(folder: Path, model, threads: int) -> dict[str, Any]:
    """The golden cases (inputs the precision gate never saw) on this checkpoint: `model`'s answers
    against torch fp32's, the largest move of a probability and the largest fp32 margin of a flip."""
    from cases import cases

    import laya

    reference = laya.load(folder, runtime="torch", threads=threads)
    tok = model.checkpoint.tokenizer
    worst, flipped, n = 0.0, 0.0, 0
    for case in cases(tok.mask_token, tok.sep_token):
        try:
            ours, theirs = model.predict(case["state"], case["questions"]), reference.predict(case["state"],
                                                                                           case["questions"])
        except Exception:  # noqa: BLE001 - a case this checkpoint refuses (both refuse alike)
            continue
        for qid, answer in theirs["answers"].items():
            p = answer.get("probabilities") or {"true": answer["noul"], "false": 1 - answer["noul"]}
            q = ours["answers"][qid].get("probabilities") or {"true": ours["answers"][qid]["noul"],
                                                             "false": 1 - ours["answers"][qid]["noul"]}
            n += 1
            worst = max(worst, max(abs(p[k] - q[k]) for k in p))
            top, second = sorted(p.values(), reverse=True)[:2]
            if max(p, key=p.__getitem__) != max(q, key=q.__getitem__):
                flipped = max(flipped, top - second)
    return {"answers": n, "max_dp": round(worst, 6), "flipped_margin": round(flipped, 6)}


def _peak_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def print_report(record: dict[str, Any]) -> None:
    names = ["upstream", *record["runtimes"]]
    print(f"\nprocessor: {record['processor']['described']}; {record['threads']} threads; shape {record['shape']} "
          f"({record['weights']} weights); upstream laya 0.4.15 on torch {record['versions']['upstream_torch']}, "
          f"ours on torch {record['versions']['torch']}")
    dtype = record["scenarios"][0]["floor_dtype"]
    print(f"{'scenario':34s} {'tokens':>6s} {dtype + ' floor':>11s} " + " ".join(f"{n:>28s}" for n in names))
    for r in record["scenarios"]:
        cells = [f"{r['medians_ms'][n]:8.1f} ms {r['speedup'][n]:5.2f}x {r['x_floor'][n]:4.1f}f" for n in names]
        print(f"{r['scenario']:34s} {r['tokens']:6d} {r['floor_ms']:8.1f} ms "
              + " ".join(f"{c:>28s}" for c in cells))
    print(f"(each cell: median, speed-up over upstream, times the {dtype} matrix floor)")
    print(f"{'peak memory (own process)':34s} {'':6s} {'':11s} " + " ".join(
        f"{(record['upstream']['peak_mb'] if n == 'upstream' else record['runtimes'][n].get('peak_mb')) or 0:>25.0f} MB"
        for n in names))
    for spec, info in record["runtimes"].items():
        print(f"{spec}: {info['runtime']} {info['precision']}" + (f", {info['plan']}" if info.get("plan") else "")
              + (", compiled" if info.get("compiled") else "") + (f"; {info['choice']}" if info.get("choice") else ""))
        if info.get("gate"):
            print(f"  gate: {info['gate']}")
        if info.get("kernels"):
            from floor import kernel_summary

            print(f"  oneDNN kernels that answered: {kernel_summary(info['kernels'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("-r", "--runtime", action="append", help="our runtimes to time, e.g. auto, packed:bf16 "
                                                                  "(default: auto)")
    parser.add_argument("--force", action="store_true", help="time reduced precisions whose gate failed too")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--upstream-venv", type=Path, default=ROOT / ".venv-upstream")
    parser.add_argument("--weights", choices=["conditioned", "raw"], default="conditioned")
    parser.add_argument("--json", type=Path, help="write the record here (for benchmarks/performance_doc.py)")
    parser.add_argument("--no-memory", action="store_true", help="skip each runtime's own process (memory, kernels)")
    parser.add_argument("--no-first-load", action="store_true",
                        help="skip the first load of the new checkpoint with an empty cache (auto)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import torch
    from make_golden import ensure_upstream

    from laya.native.cpu import cpu
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    torch.set_num_threads(args.threads)
    specs = args.runtime or ["auto"]
    python = ensure_upstream(args.upstream_venv)
    with tempfile.TemporaryDirectory() as tmp:
        extra = CONDITIONED if args.weights == "conditioned" else {}
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec(**SHAPES[args.shape], **extra))
        copy = Path(tmp) / "upstream-copy"  # upstream rewrites tokenizer_config.json in place
        shutil.copytree(folder, copy)
        os.environ["LAYA_CACHE"] = str(Path(tmp) / "cache")  # a new checkpoint meets an empty cache
        probe = plan_scenarios(load_runtimes(["torch"], folder, args.threads, False)["torch"])[0]
        fresh = first_load(folder, args.threads, probe) if "auto" in specs and not args.no_first_load else None
        if fresh:
            print(f"first load of a new checkpoint: first answer after {fresh['first_answer_s']} s, the fast runtime "
                  f"after {fresh.get('fast_s')} s ({fresh.get('upgrade', {}).get('state')})", flush=True)
        spawned = time.perf_counter()
        # upstream's own `laya`, whatever PYTHONPATH puts first for ours
        alone = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        worker = subprocess.Popen([str(python), str(HERE / "upstream_worker.py"), str(copy), str(args.threads)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=alone)
        assert worker.stdin and worker.stdout
        ready = json.loads(worker.stdout.readline())
        upstream_load_s = time.perf_counter() - spawned

        def upstream(state: str, questions: dict) -> float:
            worker.stdin.write(json.dumps({"state": state, "questions": questions}) + "\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())["ms"][0]

        upstream_first_s = upstream_load_s + upstream(probe.state, probe.questions) / 1000
        models = load_runtimes(specs, folder, args.threads, args.force)
        first = next(iter(models.values()))
        plan = plan_scenarios(first)
        results = time_interleaved(models, plan, upstream, args.repeats, args.warmup)
        upstream_peak = _peak_mb(worker.pid)
        worker.stdin.close()
        worker.wait(timeout=30)
        add_floors(results, first.checkpoint, plan, first)
        runtimes = {spec: describe_runtime(m) for spec, m in models.items()}
        for spec, model in models.items():
            if model.runtime.precision not in ("fp32", "f32"):
                runtimes[spec]["golden_cases"] = golden_drift(folder, model, args.threads)
        if not args.no_memory:
            for spec in models:
                runtimes[spec].update(in_own_process(folder, spec, args.threads, args.force, plan, kernels=True))

    machine = cpu()
    record = {
        "benchmark": "vs_upstream",
        "command": "python benchmarks/vs_upstream.py " + shlex.join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "processor": {"model": machine.model, "kind": processor_kind(machine), "described": machine.describe()},
        "threads": args.threads, "shape": args.shape, "weights": args.weights,
        "versions": {"torch": torch.__version__, "upstream_torch": ready["torch"], "upstream_laya": "0.4.15"},
        "upstream": {"peak_mb": upstream_peak, "load_s": round(upstream_load_s, 2),
                     "first_answer_s": round(upstream_first_s, 2)},
        "first_load": fresh, "runtimes": runtimes, "scenarios": results}
    print_report(record)
    if args.json:
        write_record(args.json, record)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """A benchmark's JSON record, where benchmarks/performance_doc.py reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
