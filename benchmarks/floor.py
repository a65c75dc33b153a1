"""The matrix floor of a row on this machine, and the kernels oneDNN runs: what a speed is read against.

The floor of a row is the time of its matrix products alone, each timed on its own shape with its
weights hot, summed: every projection of every encoder layer and of the head (the last head layer at
CLS and the markers only, as the packed runtime reads it) and attention's two products, in bf16 (or
fp32) through the same oneDNN kernels the compiled program calls (packed weights). A runtime can only
approach it: norms, RoPE, GeGLU, softmax and moving rows through memory come on top.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F


def _median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _projection(m: int, n: int, k: int, dtype: torch.dtype) -> float:
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
    if dtype == torch.bfloat16:  # the prepacked oneDNN product the compiled program calls
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        return _median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    return _median_ms(lambda: F.linear(x, w))


def _attention_products(n: int, heads: int, head_dim: int, dtype: torch.dtype) -> float:
    q, k, v = (torch.randn(heads, n, head_dim).to(dtype) for _ in range(3))
    p = torch.randn(heads, n, n).to(dtype)
    return _median_ms(lambda: torch.matmul(q, k.transpose(1, 2))) + _median_ms(lambda: torch.matmul(p, v))


def row_floor_ms(checkpoint, n: int, markers: int = 4, dtype: torch.dtype = torch.bfloat16) -> float:
    """The matrix floor of one row of `n` tokens (see the module's docstring), in ms."""
    enc, cfg = checkpoint.encoder, checkpoint.config
    d, inner, heads = enc.hidden_size, enc.intermediate_size, enc.num_attention_heads
    layer = (_projection(n, 3 * d, d, dtype) + _projection(n, d, d, dtype) + _projection(n, 2 * inner, d, dtype)
             + _projection(n, d, inner, dtype) + _attention_products(n, heads, enc.head_dim, dtype))
    total = enc.num_hidden_layers * layer
    read = markers + 1
    for j in range(cfg.head_layers):
        rows = read if j == cfg.head_layers - 1 else n
        total += (_projection(n, 3 * d, d, dtype) + _projection(rows, d, d, dtype) + _projection(rows, 4 * d, d, dtype)
                  + _projection(rows, d, 4 * d, dtype) + _attention_products(n, d // 64, 64, dtype))
    return total


def kernels(script: str, env: dict[str, str] | None = None) -> dict[str, int]:
    """Which oneDNN kernels ran while `script` (Python source, printing `LOADED` once loaded) answered:
    primitive kind and implementation (e.g. `inner_product brg_matmul:avx10_1_512_amx`), counted, read from
    oneDNN's verbose log. Loading is left out: what counts is what answers."""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=3600,
                         env={**os.environ, **(env or {}), "ONEDNN_VERBOSE": "1"})
    lines = out.stdout.splitlines()
    if "LOADED" not in lines:
        return {"error": out.stderr.strip().splitlines()[-1][:200] if out.stderr.strip() else "no output"}
    seen: collections.Counter[str] = collections.Counter()
    for line in lines[lines.index("LOADED"):]:
        parts = line.split(",")
        if line.startswith("onednn_verbose") and len(parts) > 6 and parts[3] == "exec":
            kind, impl = parts[5], parts[6]
            if kind == "brgemm":  # a micro-kernel of the fused attention: its data types say what ran
                impl = "ukernel " + parts[8].split()[0].split(":")[1] if len(parts) > 8 else "ukernel"
            seen[f"{kind} {impl}".strip()] += 1
    return dict(seen.most_common())


def kernel_summary(found: dict[str, Any]) -> str:
    return "; ".join(f"{name} x{count}" for name, count in found.items()) if found else "none (no oneDNN call)"


if __name__ == "__main__":  # a quick look: python benchmarks/floor.py CHECKPOINT [TOKENS...]
    import warnings

    warnings.simplefilter("ignore")
    from pathlib import Path

    from laya.encoder.checkpoint import load_checkpoint

    torch.set_num_threads(2)
    ck = load_checkpoint(Path(sys.argv[1]))
    print(json.dumps({n: round(row_floor_ms(ck, int(n)), 2) for n in sys.argv[2:] or ["128", "512"]}))
