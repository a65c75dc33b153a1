"""Stock llama.cpp's own laya server against laya, on the same GGUF and checkpoint, in one interleaved run.

    .venv/bin/python benchmarks/llamacpp_mainline.py [--shape base|small] [--types f32,q8_0]
        [--repeats 5] [--json benchmarks/results/NAME.json]

The checkpoint is generated in the exact published format (benchmarks/vs_upstream.py's shapes and
conditioned weights) and written by `laya export gguf` in llama.cpp's laya format, once per GGML type.
Each file is served by stock llama.cpp (PyPI's `xllamacpp`, build 11549: `Server.handle_systemone`, flash
attention off as its answers need on the CPU, one slot, the same thread count) and loaded by laya from
the same file (`laya.load(file.gguf)`: its llama runtime); laya's default runtime on the checkpoint
(`auto`) is the last column. Scenarios: one question over a 128- and a 512-token row, 10 choice questions
over a 128- and a 512-token state. Each repeat calls every engine once on the same request; medians,
speed-ups against stock llama.cpp on the same file, and the input tokens each engine billed (they read a
request by different rules; the states here are inside every limit, so the inputs are the same).
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from vs_upstream import CONDITIONED, SHAPES, describe_runtime, processor_kind, write_record  # noqa: E402


def stock_server(path: Path, threads: int) -> Any:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = params.n_batch = params.n_ubatch = 8192  # one question's prompt is one batch
    params.n_parallel = 1
    params.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    return xllamacpp.Server(params)


def plan(model: Any) -> list:
    from laya.encoder.bench import Scenario, scenarios

    ones = scenarios(model, [128, 512], [], 0)
    tens = [scenarios(model, [], [10], n)[0] for n in (128, 512)]
    return ones + [Scenario(t.name, t.state, t.questions) for t in tens]


def time_interleaved(engines: dict[str, Callable[[Any, dict], dict]], scenarios: list, repeats: int,
                     warmup: int) -> list[dict[str, Any]]:
    out = []
    for sc in scenarios:
        times: dict[str, list[float]] = {name: [] for name in engines}
        billed: dict[str, int] = {}
        for rep in range(warmup + repeats):
            for name, call in engines.items():
                started = time.perf_counter()
                answer = call(sc.state, sc.questions)
                elapsed = (time.perf_counter() - started) * 1000
                if "error" in answer:
                    raise SystemExit(f"{name} refused {sc.name}: {answer['error']}")
                billed[name] = answer["usage"]["input_tokens"]
                if rep >= warmup:
                    times[name].append(elapsed)
        out.append({"scenario": sc.name, "questions": len(sc.questions), "input_tokens": billed,
                    "medians_ms": {k: round(statistics.median(v), 2) for k, v in times.items()},
                    "min_ms": {k: round(min(v), 2) for k, v in times.items()}})
        print(f"  {sc.name}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in times.items()),
              flush=True)
    return out


def add_speedups(results: list[dict[str, Any]], types: list[str]) -> None:
    """Each laya column against stock llama.cpp on the same file (laya `auto` against the f32 file)."""
    for r in results:
        ms = r["medians_ms"]
        r["speedup"] = {f"laya {t}": round(ms[f"llama.cpp {t}"] / ms[f"laya {t}"], 2) for t in types}
        r["speedup"]["laya auto"] = round(ms[f"llama.cpp {types[0]}"] / ms["laya auto"], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="base")
    parser.add_argument("--types", default="f32,q8_0", help="GGML types to write and time (comma-separated)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the record here (for benchmarks/performance_doc.py)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    import importlib.metadata

    import torch

    import laya
    from laya.encoder.checkpoint import load_checkpoint
    from laya.encoder.export.laya_gguf import export
    from laya.native.cpu import cpu
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    torch.set_num_threads(args.threads)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_test_checkpoint(Path(tmp) / "ckpt", TestCheckpointSpec(**SHAPES[args.shape], **CONDITIONED))
        checkpoint = load_checkpoint(folder)
        engines: dict[str, Callable[[Any, dict], dict]] = {}
        files, servers, models = {}, [], {}
        for t in types:
            files[t] = export(checkpoint, Path(tmp) / f"laya-{t}.gguf", t)
            server = stock_server(Path(files[t]["path"]), args.threads)
            servers.append(server)
            engines[f"llama.cpp {t}"] = (lambda s: lambda state, qs: s.handle_systemone(
                {"state": state, "questions": qs}))(server)
            models[t] = laya.load(files[t]["path"], threads=args.threads)
            engines[f"laya {t}"] = models[t].predict
        auto = laya.load(folder, threads=args.threads)
        engines["laya auto"] = auto.predict
        results = time_interleaved(engines, plan(auto), args.repeats, args.warmup)
        add_speedups(results, types)
        runtimes = {f"laya {t}": describe_runtime(m) for t, m in models.items()}
        runtimes["laya auto"] = describe_runtime(auto)
        del servers

    machine = cpu()
    record = {
        "benchmark": "llamacpp_mainline",
        "command": "python benchmarks/llamacpp_mainline.py " + shlex.join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "processor": {"model": machine.model, "kind": processor_kind(machine), "described": machine.describe()},
        "threads": args.threads, "shape": args.shape, "types": types,
        "versions": {"xllamacpp": importlib.metadata.version("xllamacpp"),
                     "llama_cpp_python": importlib.metadata.version("llama_cpp_python")},
        "files": {t: {"gate": f["gate"], "tensor_types": f["tensor_types"]} for t, f in files.items()},
        "runtimes": runtimes, "scenarios": results}
    if args.json:
        write_record(args.json, record)


if __name__ == "__main__":
    main()
