"""laya's cuda runtime on one GPU: forward latency and batched throughput, with upstream laya on the same device.

    python benchmarks/gpu.py [--device cuda|cpu] [--quick] [-p fp32 -p bf16 ...] [--force] [--lazy]
        [--repeats 100] [--upstream-venv .venv-upstream] [--json OUT.json]

Checkpoints are generated in the exact published format (random weights, attention logits of spread 1
as in benchmarks/vs_upstream.py): the full mmBERT-base shape (22 layers, d 768, 12 heads, GeGLU 1152, a
256k vocabulary) and a ModernBERT-large shape (28 layers, d 1024, 16 heads, GeGLU 2624, a 50k
vocabulary), both with the 128-token sliding window, global attention every third layer and 512-token
rows. `--quick` swaps in two small shapes of the same flavours: a smoke test that runs on the CPU in
seconds (`--device cpu --quick`), so the script is checked without a GPU.

Per shape and precision (default: fp32, and bf16 and fp16 where the GPU has their tensor cores; fp32
only on the CPU), after loading (every bucket captured, unless `--lazy`):
- one question of 4 options over a 128-token and a 512-token row: p50 and p99 of `runtime.forward` on
  the prepared batch (copies in and out included: it returns numpy) and of the whole `predict`;
- decisions per second with batches of 64 rows (64 states of about 128 tokens, one 4-option question
  each, one `predict_batch` call).
Upstream laya 0.4.15 (its Agent, its own precision policy on the device) is timed on the same device, in
its own virtual environment and process (benchmarks/upstream_device_worker.py), on the same requests: its
whole call, never at the same time as ours. Where that environment is absent or cannot import laya
(a GPU machine it was not carried to), the record says "not carried".

`--json` writes the record (`render` turns it into the markdown of docs/performance.md's tables); the
table printed last is the summary.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya.encoder.model import Model

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONDITIONED = {"attention_logit_std": 1.0, "scorer_gain": 1.0}
SHAPES = {
    "base": dict(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152,
                 local_attention=128, max_len=512, head_max_len=256, vocab_size=256000, seed=3),
    "large": dict(flavour="modernbert", hidden_size=1024, num_layers=28, num_heads=16, intermediate_size=2624,
                  local_attention=128, max_len=512, head_max_len=256, vocab_size=50368, seed=4),
    "quick-base": dict(flavour="mmbert", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=96,
                       local_attention=128, max_len=512, head_max_len=256, seed=3),
    "quick-large": dict(flavour="modernbert", hidden_size=128, num_layers=3, num_heads=2, intermediate_size=160,
                        local_attention=128, max_len=512, head_max_len=256, seed=4),
}
LENGTHS = (128, 512)
BATCH_ROWS = 64
BATCH_TOKENS = 128
WORDS = ["refund", "invoice", "parcel", "late", "broken", "billing", "upgrade", "password", "order", "thanks"]
QUESTION = {"team": {"type": "choice", "instructions": "Which team should handle this?",
                     "criteria": {"billing": "payments and refunds", "shipping": "parcels and delivery",
                                  "sales": "plans and pricing", "support": "technical problems"}}}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3)}


def state_of(model: Model, n_tokens: int, seed: int = 0) -> str:
    """A state that makes the question's row about `n_tokens` long (the row is cut at the checkpoint's
    `max_len`): words added until the row is long enough."""
    words = [WORDS[(seed + i * 7) % len(WORDS)] for i in range(4 * n_tokens)]
    low, high = 0, len(words)
    while low < high:  # the fewest words whose row reaches n_tokens
        mid = (low + high) // 2
        if len(model.prepare([" ".join(words[:mid])], QUESTION).rows[0][0].ids) >= n_tokens:
            high = mid
        else:
            low = mid + 1
    return " ".join(words[:low])


def requests(model: Model) -> dict[str, Any]:
    """The benchmark's requests, built once per shape (every runtime and upstream answer the same)."""
    return {"scenarios": [(f"1 question of 4 options, {n} tokens", state_of(model, n)) for n in LENGTHS],
            "batch": [state_of(model, BATCH_TOKENS, seed=i) for i in range(BATCH_ROWS)]}


def timed(call: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
    """Milliseconds of each timed call (after `warmup` untimed ones). Our calls return numpy answers, so
    each time ends when the device has finished."""
    out = []
    for i in range(warmup + repeats):
        started = time.perf_counter()
        call()
        if i >= warmup:
            out.append((time.perf_counter() - started) * 1000)
    return out


def time_ours(model: Model, reqs: dict[str, Any], repeats: int, batch_repeats: int) -> dict[str, Any]:
    from laya.encoder.batch import collate, padded_length

    scenarios = []
    for name, state in reqs["scenarios"]:
        rows = model.prepare([state], QUESTION).rows[0]
        batch = collate(rows, model.tokenizer.pad_id, length=padded_length(max(len(r.ids) for r in rows)))
        forward = timed(lambda batch=batch: model.runtime.forward(batch), repeats, 3)
        predict = timed(lambda state=state: model.predict(state, QUESTION), repeats, 3)
        scenarios.append({"scenario": name, "tokens": sum(len(r.ids) for r in rows),
                          **{f"forward_{k}": v for k, v in summary(forward).items()},
                          **{f"predict_{k}": v for k, v in summary(predict).items()}})
    states = reqs["batch"]
    ms = timed(lambda: model.predict_batch(states, QUESTION), batch_repeats, 1)
    tokens = sum(len(r.ids) for rows in model.prepare(states, QUESTION).rows for r in rows)
    return {"scenarios": scenarios, "batch": {"rows": len(states), "tokens": tokens, **summary(ms),
                                              "decisions_per_s": round(len(states) / (percentile(ms, 50) / 1000), 1)}}


def load_ours(folder: Path, precision: str, device: str, force: bool, lazy: bool, threads: int | None
              ) -> dict[str, Any]:
    """One runtime loaded (its gate and warm-up included), or why it was refused."""
    import laya
    from laya.errors import LayaError

    options: dict[str, Any] = {"precision": precision, "device": device, "warm": not lazy}
    if force and precision != "fp32":
        options["force"] = True
    if threads:
        options["threads"] = threads
    reset_peak(device)
    started = time.perf_counter()
    try:
        model = laya.load(folder, runtime="cuda", **options)
    except LayaError as exc:
        return {"label": f"cuda {precision}", "refused": str(exc).splitlines()[0]}
    runtime = model.runtime
    gate = runtime.gate
    return {"label": f"cuda {precision}", "runtime": "cuda", "precision": precision, "model": model,
            "load_s": round(time.perf_counter() - started, 2), "details": runtime.details(),
            "gate": {k: gate[k] for k in ("max_dp", "flipped_margin", "batch_dependence_max_dp", "passed", "plan")
                     if k in gate} if gate else None}


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_mb(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1)


def upstream_python(venv: Path) -> tuple[Path | None, str, str]:
    """The upstream environment's python if it imports upstream laya, else None; its status ("timed" or
    "not carried") and why."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return None, "not carried", f"{venv} is absent"
    probe = subprocess.run([str(python), "-I", "-c", "import laya.agent"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, "not carried", f"{venv} cannot import upstream laya ({last})"
    return python, "timed", f"upstream laya in {venv}"


def time_upstream(python: Path, folder: Path, device: str, reqs: dict[str, Any], repeats: int, batch_repeats: int,
                  threads: int | None) -> dict[str, Any]:
    """Upstream's Agent on the same device and requests, in its own process; its whole call."""
    import shutil

    copy = folder.parent / f"{folder.name}-upstream"  # upstream rewrites tokenizer_config.json in place
    if not copy.exists():
        shutil.copytree(folder, copy)
    worker = subprocess.Popen([str(python), "-I", "-W", "ignore", str(HERE / "upstream_device_worker.py"), str(copy),
                               device, str(threads or 0)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdin and worker.stdout
    try:
        ready = json.loads(worker.stdout.readline())
        if device.startswith("cuda") and not str(ready.get("device")).startswith("cuda"):
            return {"label": "upstream", "failed": f"not timed: upstream's torch {ready.get('torch')} sees no GPU "
                                                   f"(it would run on {ready.get('device')})"}

        def job(**kwargs: Any) -> list[float]:
            worker.stdin.write(json.dumps({"questions": QUESTION, **kwargs}) + "\n")
            worker.stdin.flush()
            return json.loads(worker.stdout.readline())["ms"]

        scenarios = [{"scenario": name, **{f"predict_{k}": v for k, v in
                                           summary(job(state=state, warmup=3, repeats=repeats)).items()}}
                     for name, state in reqs["scenarios"]]
        ms = job(states=reqs["batch"], warmup=1, repeats=batch_repeats)
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    decisions = round(len(reqs["batch"]) / (percentile(ms, 50) / 1000), 1)
    return {"label": f"upstream ({ready.get('dtype') or ready.get('device')})", "torch": ready.get("torch"),
            "device": ready.get("device"), "dtype": ready.get("dtype"), "scenarios": scenarios,
            "batch": {"rows": len(reqs["batch"]), **summary(ms), "decisions_per_s": decisions}}


def precisions_for(device: str, asked: list[str] | None) -> list[str]:
    """What is timed: as asked, else fp32 and the reduced precisions this GPU has tensor cores for."""
    if asked:
        return asked
    if not device.startswith("cuda"):
        return ["fp32"]
    import torch

    major, _ = torch.cuda.get_device_capability()
    return ["fp32"] + (["bf16"] if major >= 8 else []) + (["fp16"] if major >= 7 else [])


def run_shape(shape: str, folder: Path, args: argparse.Namespace, upstream: Path | None) -> dict[str, Any]:
    runtimes = []
    reqs = None
    for precision in precisions_for(args.device, args.precision):
        loaded = load_ours(folder, precision, args.device, args.force, args.lazy, args.threads)
        model = loaded.pop("model", None)
        if model is not None:
            reqs = reqs or requests(model)
            loaded.update(time_ours(model, reqs, args.repeats, args.batch_repeats))
            loaded["peak_gpu_mb"] = peak_mb(args.device)
        runtimes.append(loaded)
        print(f"  {shape} {loaded['label']}: {'refused: ' + loaded['refused'] if 'refused' in loaded else 'timed'}",
              flush=True)
        del model
        gc.collect()
        free_device(args.device)
    out: dict[str, Any] = {"shape": shape, "spec": SHAPES[shape], "runtimes": runtimes}
    if upstream is not None and reqs is not None:
        try:
            out["upstream"] = time_upstream(upstream, folder, args.device, reqs, args.repeats, args.batch_repeats,
                                            args.threads)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            out["upstream"] = {"label": "upstream", "failed": f"{type(exc).__name__}: {exc}"}
    return out


def free_device(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def device_record(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        from laya.native.cpu import cpu

        machine = cpu()
        return {"type": "cpu", "name": machine.model, "described": machine.describe()}
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    return {"type": "cuda", "name": name, "capability": f"{major}.{minor}", "described": f"{name} (sm {major}.{minor})",
            "memory_gb": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}


def _cells(entry: dict[str, Any]) -> list[str]:
    """A runtime's figures: forward and predict p50/p99 per row length, then decisions per second."""
    if "refused" in entry or "failed" in entry:
        return [(f"refused: {entry['refused']}" if "refused" in entry else entry["failed"])[:110]]
    cells = []
    for s in entry["scenarios"]:
        forward = (f"{s['forward_p50_ms']:.2f}/{s['forward_p99_ms']:.2f}" if "forward_p50_ms" in s else "-")
        cells += [forward, f"{s['predict_p50_ms']:.2f}/{s['predict_p99_ms']:.2f}"]
    return cells + [f"{entry['batch']['decisions_per_s']:,.0f}"]


def table_lines(record: dict[str, Any]) -> list[str]:
    """The summary table: one line per shape and runtime (upstream's forward is not separable: '-')."""
    heads = ["shape", "runtime"]
    for n in LENGTHS:
        heads += [f"fwd {n} p50/p99 ms", f"predict {n} p50/p99 ms"]
    heads.append(f"decisions/s ({BATCH_ROWS} rows)")
    rows = [heads]
    for shape in record["shapes"]:
        entries = shape["runtimes"] + ([shape["upstream"]] if "upstream" in shape else [])
        for entry in entries:
            rows.append([shape["shape"], entry["label"], *_cells(entry)])
        if "upstream" not in shape:
            rows.append([shape["shape"], "upstream", f"{record['upstream']['status']} ({record['upstream']['why']})"])
    full = [r for r in rows if len(r) == len(heads)]  # a refusal or "not carried" is one cell, not sized
    widths = [max(len(r[i]) for r in full) for i in range(len(heads))]
    widths[:2] = [max(len(r[i]) for r in rows) for i in range(2)]
    return ["  ".join(cell.rjust(widths[i]) if i > 1 and len(r) == len(heads) else cell.ljust(widths[i])
                      if i < 2 else cell for i, cell in enumerate(r)).rstrip() for r in rows]


def render(record: dict[str, Any]) -> list[str]:
    """The record as markdown, in docs/performance.md's style (benchmarks/performance_doc.py can register it)."""
    dev = record["device"]
    lines = [f"### laya's cuda runtime on {dev['described']}", "",
             f"`{record['command']}` ({record['date']}; torch {record['versions']['torch']}, CUDA "
             f"{record['versions']['cuda']}; upstream: {record['upstream']['status']})", ""]
    table = table_lines(record)
    cells = [[c.strip() for c in line.split("  ") if c.strip()] for line in table]
    lines += ["| " + " | ".join(cells[0]) + " |", "|---|---|" + "---:|" * (len(cells[0]) - 2)]
    lines += ["| " + " | ".join(c) + " |" for c in cells[1:]]
    for shape in record["shapes"]:
        for r in shape["runtimes"]:
            if r.get("details"):
                d = r["details"]
                gate = f"; gate {'passed' if r['gate']['passed'] else 'FAILED (forced)'}: max |dp| " \
                       f"{r['gate']['max_dp']:.3g}" if r.get("gate") else "; exact (fp32)"
                lines.append(f"- {shape['shape']} `{r['label']}`: {d['plan']}, {d['captured']} buckets "
                             f"{'captured' if d['graphs'] else 'eager'} in {d['warm_s']} s{gate}")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (a smoke test)")
    parser.add_argument("--quick", action="store_true", help="small shapes and few repeats: a smoke test")
    parser.add_argument("-p", "--precision", action="append", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--force", action="store_true", help="time reduced precisions whose gate failed too")
    parser.add_argument("--lazy", action="store_true", help="capture buckets as used, not all at load")
    parser.add_argument("--repeats", type=int, default=None, help="timed forward/predict calls (default 100)")
    parser.add_argument("--batch-repeats", type=int, default=None, help="timed 64-row batches (default 20)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: 1 with --device cpu, torch's default on a GPU)")
    parser.add_argument("--upstream-venv", type=Path, default=ROOT / ".venv-upstream")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args()
    args.repeats = args.repeats or (5 if args.quick else 100)
    args.batch_repeats = args.batch_repeats or (2 if args.quick else 20)
    warnings.simplefilter("ignore")
    import torch

    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"benchmarks/gpu.py: no CUDA device here (torch {torch.__version__}); use --device cpu --quick for "
              "a smoke test", file=sys.stderr)
        return 2
    if args.threads is None and not args.device.startswith("cuda"):
        args.threads = 1  # a smoke test: one thread is not slowed by whatever else the machine runs
    if args.threads:
        torch.set_num_threads(args.threads)
    upstream, status, why = upstream_python(args.upstream_venv)
    print(f"upstream: {status} ({why})", flush=True)
    shapes = ["quick-base", "quick-large"] if args.quick else ["base", "large"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            started = time.perf_counter()
            folder = write_test_checkpoint(Path(tmp) / shape, TestCheckpointSpec(**SHAPES[shape], **CONDITIONED))
            print(f"{shape}: generated in {time.perf_counter() - started:.2f} s", flush=True)
            results.append(run_shape(shape, folder, args, upstream))
    record = {"benchmark": "gpu", "command": "python benchmarks/gpu.py " + shlex.join(sys.argv[1:]),
              "date": datetime.date.today().isoformat(), "device": device_record(args.device),
              "processor": {"kind": f"GPU {device_record(args.device)['name']}",
                            "described": device_record(args.device)["described"]},
              "quick": args.quick, "repeats": args.repeats, "batch_repeats": args.batch_repeats,
              "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "upstream_laya": "0.4.15"},
              "upstream": {"status": status, "why": why}, "shapes": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    print("\n" + "\n".join(table_lines(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
