"""The llama runtime's bundle: a checkpoint's encoder as a GGUF file llama.cpp runs as `modern-bert`.

What users export and share is one self-contained file in llama.cpp's own laya format
(`laya/encoder/export/laya_gguf.py`, `laya export gguf`); this bundle is the llama runtime's working form of a
checkpoint or of such a file (exported on first use into the cache). It holds `encoder.gguf`, the
decision head, scorer and act head in fp32 (`head.safetensors`, the checkpoint's own tensor names: the
head runs on the client in numpy), the configs and tokenizer, and the manifest. The keys and tensors
are what llama.cpp's `modern-bert` loader reads (docs/notes/llama-encoder-findings.md has the facts,
with the lines they come from): no tokenizer inside (laya tokenises and passes ids), both RoPE bases
written (llama.cpp's local one defaults to 10000, not the global one), the full window width
(llama.cpp halves it itself), the local/global pattern as one flag per layer.

Types: `f32` (exact up to the kernels' summation order, given llama.cpp built with
scripts/llama-modern-bert.patch: stock llama.cpp reads GeGLU's GELU from a 16-bit table), `f16` (the
published weights are fp16: only activations lose bits), and `q8_0`, a mixed file: the feed-forward
matrices of the later half of the layers in Q8_0 (int8 in blocks of 32 with one scale each), the rest
f16. Measured on the gate's rows: every matrix in Q8_0 failed on sensitive small checkpoints (max |dp|
0.197); the feed-forward matrices of every layer but the first passed there (<= 0.021) but not on the
22-layer mmBERT-base shape (0.098, argmax agreement 0.875; only ffn_down: 0.059); the later half's
passed there too (0.039, agreement 1.0). f16 and q8_0 are gated against the fp32 reference at export,
and the gate's figures go into the manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya.digests import sha256_of
from laya.encoder.bundle import ENCODER_FILE, GGUF_REVISION, HEAD_FILE, encoder_tensors, head_tensors
from laya.encoder.checkpoint import Checkpoint
from laya.errors import CheckpointError

TYPES = ("f32", "f16", "q8_0")
Q8_0_BLOCK = 32


def check_expressible(checkpoint: Checkpoint, gguf_type: str) -> None:
    """Refuse, naming it, what llama.cpp's modern-bert graph cannot run as the reference does."""
    if gguf_type not in TYPES:
        raise CheckpointError(f"GGUF type must be one of {', '.join(TYPES)}, got {gguf_type!r}")
    enc, raw = checkpoint.encoder, checkpoint.encoder.raw
    problems = []
    if enc.head_dim % 2:
        problems.append(f"head_dim {enc.head_dim} is odd (llama.cpp's NEOX RoPE rotates pairs)")
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict):
        kinds = {rope.get("rope_type")} | {v.get("rope_type") for v in rope.values() if isinstance(v, dict)}
        scaled = sorted(str(k) for k in kinds - {None, "default"})
        if scaled:
            problems.append(f"rope_type {', '.join(scaled)} (llama.cpp's modern-bert applies plain RoPE)")
    for key in ("rope_scaling",):
        if raw.get(key):
            problems.append(f"{key} {raw[key]!r} (llama.cpp's modern-bert applies plain RoPE)")
    if raw.get("partial_rotary_factor", 1.0) not in (1, 1.0):
        problems.append(f"partial_rotary_factor {raw['partial_rotary_factor']!r} (modern-bert rotates whole heads)")
    if raw.get("num_key_value_heads", enc.num_attention_heads) != enc.num_attention_heads:
        problems.append("num_key_value_heads differs from num_attention_heads (modern-bert has no grouped heads)")
    local = [not enc.is_global(i) for i in range(enc.num_hidden_layers)]
    if all(local):
        # llama.cpp builds the full-attention mask whatever the layers are, and aborts the process when
        # no layer reads it (no buffer is allocated for it)
        problems.append("every layer attends within the sliding window (modern-bert needs a global layer)")
    if gguf_type == "q8_0":
        for what, n in (("hidden_size", enc.hidden_size), ("intermediate_size", enc.intermediate_size)):
            if n % Q8_0_BLOCK:
                problems.append(f"{what} {n} is not a multiple of {Q8_0_BLOCK} (Q8_0 quantises rows in blocks of "
                                f"{Q8_0_BLOCK}); export f16 or f32")
    if problems:
        raise CheckpointError(f"{checkpoint.path}: llama.cpp's modern-bert graph cannot run this encoder: "
                              + "; ".join(problems))


def write_tensors(writer: Any, checkpoint: Checkpoint, gguf_type: str, head: bool = False) -> dict[str, int]:
    """The encoder's tensors in `gguf_type` (norms f32 in every type, as llama.cpp's converter keeps them;
    q8_0: the later half's feed-forward matrices in Q8_0, the rest f16), then with `head` the decision
    head, type embedding and scorer in f32; returns how many tensors each GGML type holds."""
    import gguf

    q8, f16, f32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    layers = checkpoint.encoder.num_hidden_layers
    named = [(name, source, f32 if gguf_type == "f32" else q8 if gguf_type == "q8_0" and quantised else f16)
             for name, source, quantised in encoder_tensors(layers)]
    if head:
        named += [(name, source, f32) for name, source in head_tensors(layers, checkpoint.config.head_layers)]
    counts: dict[str, int] = {}
    for name, source, kind in named:
        weight = np.ascontiguousarray(checkpoint.weights[source], dtype=np.float32)
        if weight.ndim == 1:
            kind = f32
        data = gguf.quants.quantize(weight, q8) if kind == q8 else weight.astype(np.float16) if kind == f16 else weight
        writer.add_tensor(name, data, raw_dtype=q8 if kind == q8 else None)
        counts[kind.name] = counts.get(kind.name, 0) + 1
    return counts


def export_bundle(checkpoint: Checkpoint, out: Path, gguf_type: str = "f32",
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write a llama bundle into `out` and return its manifest."""
    from laya.encoder.bundle import write_llama_bundle, write_manifest

    check_expressible(checkpoint, gguf_type)
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    say(f"writing the encoder as a {gguf_type} GGUF")
    manifest = write_llama_bundle(checkpoint, out, gguf_type,
                                  lambda writer: write_tensors(writer, checkpoint, gguf_type))
    manifest.update(encoder_sha256=sha256_of(out / ENCODER_FILE), head_sha256=sha256_of(out / HEAD_FILE))
    if gguf_type == "q8_0":
        first = max(1, checkpoint.encoder.num_hidden_layers // 2)
        manifest["q8_0_scheme"] = f"ffn_up and ffn_down of layers >= {first} in Q8_0; other matrices f16; norms f32"
    if gguf_type != "f32":
        say(f"measuring the {gguf_type} gate against the fp32 reference")
        manifest["gate"] = measure_gate(checkpoint, out, manifest)
    write_manifest(out, manifest)
    say(f"done in {time.perf_counter() - started:.1f} s: {out}")
    return manifest


def measure_gate(checkpoint: Checkpoint, folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The reduced type against fp32: the torch reference where torch is installed, else this
    checkpoint's f32 GGUF (within 1e-4 of it on a patched llama.cpp); recorded in the manifest."""
    import importlib.util
    import tempfile

    from laya.encoder.bundle import write_llama_bundle
    from laya.encoder.gate import measure
    from laya.encoder.runtimes.llama import LlamaRuntime

    candidate = LlamaRuntime.from_folder(folder, manifest, threads=None)
    try:
        if importlib.util.find_spec("torch") is not None:
            from laya.encoder.runtimes.pytorch import TorchRuntime

            record = measure(checkpoint, TorchRuntime(checkpoint).forward, candidate.forward, manifest["precision"])
            return {**record, "reference": "torch fp32"}
        with tempfile.TemporaryDirectory() as tmp:
            exact = write_llama_bundle(checkpoint, Path(tmp), "f32", lambda w: write_tensors(w, checkpoint, "f32"))
            reference = LlamaRuntime.from_folder(Path(tmp), exact, threads=None)
            try:
                record = measure(checkpoint, reference.forward, candidate.forward, manifest["precision"])
            finally:
                reference.close()
        return {**record, "reference": "llama f32"}
    finally:
        candidate.close()


def runtime_inputs(checkpoint: Checkpoint, options: dict[str, Any], cache_dir: Path | None = None) -> dict[str, Any]:
    """What `laya.load(checkpoint, runtime="llama", ...)` hands the runtime: a bundle exported on first use
    into a cache keyed by the checkpoint's fingerprint and the exporter's revision (`bundle_key`)."""
    from laya.encoder.bundle import cached_export

    precision = options.get("precision", "f32")
    if precision not in TYPES:
        raise CheckpointError(f"llama precision must be one of {', '.join(TYPES)}, got {precision!r}")
    bundle = cached_export("llama", bundle_key(checkpoint, precision),
                           lambda folder: export_bundle(checkpoint, folder, precision), cache_dir)
    return {**options, "bundle": bundle}


def bundle_key(checkpoint: Checkpoint, gguf_type: str) -> str:
    return f"{checkpoint.fingerprint[:16]}-{gguf_type}-r{GGUF_REVISION}"

