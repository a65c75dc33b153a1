"""`laya export onnx`: a checkpoint to an ONNX bundle that runs with no torch installed.

One graph, inputs `input_ids, attention_mask, marker_pos, marker_mask, qtype` and outputs
`logits, act_logits`, dynamic in batch, length and marker count (exported with a batch of 2 rows so
nothing is specialised to batch 1). The int8 variant quantises the encoder's matmuls dynamically
and is gated against fp32 on fixed decision rows; the gate's figures go into the manifest.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laya.checkpoint import Checkpoint

OPSET = 18
# Bumped whenever the exported graph changes, so that cached bundles from an older exporter are not reused.
GRAPH_REVISION = 4
INPUTS = ["input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype"]
OUTPUTS = ["logits", "act_logits"]


def _example(checkpoint: Checkpoint):
    """Two rows (so nothing specialises to batch 1) with 3 and 2 markers."""
    import torch

    from laya.encoder.batch import collate
    from laya.encoder.rows import build_rows
    from laya.questions import parse_questions

    questions = parse_questions({"a": {"type": "choice", "instructions": "Which one?", "criteria": ["x", "y", "z"]},
                                 "b": {"type": "noul", "instructions": "Is it?"}})
    tok = checkpoint.tokenizer
    rows = build_rows(tok, "an example state for tracing the graph", questions, checkpoint.config.max_len,
                      checkpoint.config.head_max_len)
    batch = collate(rows, tok.pad_id)
    return tuple(torch.from_numpy(getattr(batch, name)) for name in INPUTS)


def export_fp32(checkpoint: Checkpoint, path: Path) -> None:
    import torch
    from laya.export.torch_net import DecisionNet, fused_attention, ort_attention_translation

    module = DecisionNet.load(checkpoint, attention=fused_attention)
    example = _example(checkpoint)
    batch, length, markers = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=2), \
        torch.export.Dim("markers", min=2)
    shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length},
              "marker_pos": {0: batch, 1: markers}, "marker_mask": {0: batch, 1: markers}, "qtype": {0: batch}}
    import logging
    import warnings

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on axis names and deprecations
        program = torch.onnx.export(module, example, dynamo=True, dynamic_shapes=shapes, input_names=INPUTS,
                                    output_names=OUTPUTS, opset_version=OPSET, optimize=True, verbose=False,
                                    custom_translation_table=ort_attention_translation())
    program.save(str(path), external_data=False)
    _strip_stack_traces(path)


def _strip_stack_traces(path: Path) -> None:
    """Keep only each node's module namespace (used to pick the int8 nodes). The exporter's other
    notes vary between runs and checkouts: Python stack traces name files and lines, and the FX
    text names whichever of two equal buffers it deduplicated to."""
    import onnx

    graph = onnx.load(str(path))
    for node in graph.graph.node:
        keep = [(p.key, p.value) for p in node.metadata_props if p.key == "namespace"]
        del node.metadata_props[:]
        for key, value in keep:
            node.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(path))


def measure_gate(checkpoint: Checkpoint, fp32_path: Path, int8_path: Path) -> dict[str, Any]:
    """int8 against fp32 on the gate's fixed rows (`laya.gate`), both run the way the runtime runs them.

    The runtime runs int8 rows one by one, so batch dependence is 0 unless that breaks;
    `padded_batch_max_dp` shows the drift a padded int8 batch would have had, for information.
    """
    from laya.gate import measure
    from laya.runtimes.onnx import OnnxRuntime

    fp32 = OnnxRuntime.from_graph(fp32_path, "fp32")
    int8 = OnnxRuntime.from_graph(int8_path, "int8")
    return measure(checkpoint, fp32.forward, int8.forward, "int8", extra={"padded_batch": int8._run})


def quantize_int8(fp32_path: Path, int8_path: Path) -> int:
    """Dynamic int8 of the encoder's matmuls only; the decision head and act head stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fp32_path), load_external_data=False)
    targets = [n.name for n in graph.graph.node if n.op_type in ("MatMul", "Gemm")
               and any(p.key == "namespace" and "DecisionNet/layers." in p.value for p in n.metadata_props)]
    quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, nodes_to_quantize=targets,
                     per_channel=True, extra_options={"MatMulConstBOnly": True})
    return len(targets)


def export_bundle(checkpoint: Checkpoint, out: Path, *, int8: bool = False,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write an ONNX bundle into `out` and return its manifest."""
    from laya.bundle import base_manifest, copy_checkpoint_files, write_manifest

    say = progress or (lambda _msg: None)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    copy_checkpoint_files(checkpoint, out)
    with tempfile.TemporaryDirectory() as tmp:
        fp32_path = Path(tmp) / "fp32.onnx"
        say("exporting the fp32 graph (torch.export)")
        export_fp32(checkpoint, fp32_path)
        manifest = base_manifest(checkpoint, "onnx", "int8" if int8 else "fp32")
        manifest.update(opset=OPSET, graph_revision=GRAPH_REVISION, inputs=INPUTS, outputs=OUTPUTS, graph="model.onnx")
        if int8:
            say("quantising the encoder's matmuls to int8")
            int8_path = Path(tmp) / "int8.onnx"
            manifest["int8_matmuls"] = quantize_int8(fp32_path, int8_path)
            say("measuring the int8 gate against fp32")
            manifest["gate"] = measure_gate(checkpoint, fp32_path, int8_path)
            shutil.copyfile(int8_path, out / "model.onnx")
        else:
            shutil.copyfile(fp32_path, out / "model.onnx")
    manifest["fingerprint"] = checkpoint.fingerprint
    manifest["graph_sha256"] = hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest()
    write_manifest(out, manifest)
    say(f"done in {time.perf_counter() - started:.1f} s: {out}")
    return manifest


def runtime_inputs(checkpoint: Checkpoint, options: dict[str, Any], cache_dir: Path | None = None) -> dict[str, Any]:
    """What `laya.load(checkpoint, runtime="onnx", ...)` hands the runtime: a bundle exported on first use."""
    from laya.runtimes.onnx import check_precision

    precision = options.get("precision", "fp32")
    check_precision(precision)
    return {**options, "bundle": cached_bundle(checkpoint, precision, cache_dir)}


def cached_bundle(checkpoint: Checkpoint, precision: str, cache_dir: Path | None = None,
                  progress: Callable[[str], None] | None = None) -> Path:
    """A bundle for `checkpoint`, exported on first use into a cache keyed by its fingerprint and the
    exporter's graph revision."""
    from laya.bundle import cached_export

    key = f"{checkpoint.fingerprint[:16]}-{precision}-r{GRAPH_REVISION}"
    return cached_export("onnx", key, lambda folder: export_bundle(checkpoint, folder, int8=precision == "int8",
                                                                   progress=progress), cache_dir)
