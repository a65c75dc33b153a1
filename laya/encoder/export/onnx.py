"""`laya export onnx`: a checkpoint to an ONNX bundle that runs with no torch installed.

One graph, inputs `input_ids, attention_mask, marker_pos, marker_mask, qtype` and outputs
`logits, act_logits`, dynamic in batch, length and marker count (exported with a batch of 2 rows so
nothing is specialised to batch 1). The int8 variant quantises the encoder's matmuls (int8 weights per
output channel, int8 activations scaled per token at run time; the first encoder layer stays fp32) and
is gated against fp32 on fixed decision rows; the gate's figures go into the manifest.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from laya.encoder.checkpoint import Checkpoint

OPSET = 18
# Bumped whenever the exported graph changes, so that cached bundles from an older exporter are not reused.
GRAPH_REVISION = 8
# Bumped whenever the int8 quantisation changes (part of the int8 cache key only). 2: per-token activation
# scales with u8u8 integer matmuls and the first encoder layer in fp32 (1 was onnxruntime's dynamic
# per-tensor u8s8 quantisation, whose AVX2 kernel saturates without VNNI).
INT8_REVISION = 2
# Encoder layers kept in fp32 in the int8 graph: the first layer is the most sensitive one on every
# checkpoint measured (its rounding error is carried through every later layer).
INT8_FP32_LAYERS = frozenset({0})
# Projections kept in fp32 in every layer of the int8 graph (names in laya.encoder.export.torch_net's layers).
INT8_FP32_PROJECTIONS: frozenset[str] = frozenset()
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

    from laya.encoder.export.torch_net import ORT_FUSED, PortableNet, ort_translation

    module = PortableNet.load(checkpoint, ops=ORT_FUSED)
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
                                    custom_translation_table=ort_translation())
    if program is None:  # dynamo=True returns the program; None would mean an exporter that changed
        raise RuntimeError("torch.onnx.export returned no program")
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


def _rewrite(graph, nodes: list, added: list) -> None:
    """`graph` with `nodes` as its operators: the initializers nothing reads any more dropped,
    `added` appended (the graph passes below each replace some nodes and their constants)."""
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)


def split_products(source: Path, target: Path) -> int:
    """Each `MatMul` (+ bias `Add`) whose product is only split along its last axis (the encoder's Wqkv
    and GeGLU's Wi, the head's packed projection) becomes one product per part, each with its slice of
    the constant weight and bias. The same arithmetic, but no Split: onnxruntime copies a last-axis
    split element by element, and at these sizes that copy cost as much as a matmul. Returns how many
    products were split. (The int8 graph is quantised from the unsplit one: it would otherwise quantise
    the same input once per part.)"""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    for out in graph.output:
        readers[out.name] = readers.get(out.name, 0) + 1

    def constant(name: str, rank: int):
        tensor = inits.get(name)
        return numpy_helper.to_array(tensor) if tensor is not None and len(tensor.dims) == rank else None

    replaced: dict[str, list] = {}  # the Split's name -> the nodes that take its place
    dropped: set[str] = set()
    added: list = []
    for split in graph.node:
        axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
        if split.op_type != "Split" or len(split.input) != 1 or axis not in (-1, 2):
            continue
        source_node, bias = producer.get(split.input[0]), None
        if source_node is not None and source_node.op_type == "Add" and readers.get(split.input[0]) == 1:
            bias = constant(source_node.input[1], 1)
            add, source_node = source_node, producer.get(source_node.input[0])
            if bias is None or readers.get(add.input[0]) != 1:
                continue
        else:
            add = None
        if source_node is None or source_node.op_type != "MatMul" or readers.get(source_node.output[0]) != 1:
            continue
        weight = constant(source_node.input[1], 2)
        parts = len(split.output)
        if weight is None or weight.shape[1] % parts:
            continue
        width = weight.shape[1] // parts
        nodes = []
        for i, out in enumerate(split.output):
            name = f"{source_node.name}/part{i}"
            w = f"{name}/weight"
            added.append(numpy_helper.from_array(np.ascontiguousarray(weight[:, i * width:(i + 1) * width]), w))
            product = helper.make_node("MatMul", [source_node.input[0], w], [out if add is None else f"{name}/y"],
                                       name=name)
            product.metadata_props.extend(source_node.metadata_props)  # the int8 pass reads the namespace
            nodes.append(product)
            if add is not None and bias is not None:
                b = f"{name}/bias"
                added.append(numpy_helper.from_array(np.ascontiguousarray(bias[i * width:(i + 1) * width]), b))
                nodes.append(helper.make_node("Add", [f"{name}/y", b], [out], name=f"{name}/add"))
        replaced[split.name] = nodes
        dropped |= {source_node.name} | ({add.name} if add is not None else set())
    if not replaced:
        onnx.save(model, str(target))
        return 0
    nodes = []
    for node in graph.node:
        if node.name in dropped:
            continue
        nodes.extend(replaced.get(node.name, [node]))
    _rewrite(graph, nodes, added)
    onnx.checker.check_model(model)
    onnx.save(model, str(target))
    return len(replaced)


def measure_gate(checkpoint: Checkpoint, fp32_path: Path, int8_path: Path) -> dict[str, Any]:
    """int8 against fp32 on the gate's fixed rows (`laya.encoder.gate`), both run the way the runtime runs them.

    The runtime runs int8 rows one by one, so batch dependence is 0 unless that breaks;
    `padded_batch_max_dp` shows the drift a padded int8 batch would have had, for information.
    """
    from laya.encoder.gate import measure
    from laya.encoder.runtimes.onnx import OnnxRuntime

    fp32 = OnnxRuntime.from_graph(fp32_path, "fp32")
    int8 = OnnxRuntime.from_graph(int8_path, "int8")
    return measure(checkpoint, fp32.forward, int8.forward, "int8", extra={"padded_batch": int8._run})


_ENCODER_LINEAR = re.compile(r"/layers\.(\d+)\.(\w+):")  # the encoder's, not the head's `head.layers`


def _int8_targets(graph) -> list[str]:
    """The encoder layers' MatMuls with a constant 2-D fp32 weight, outside `INT8_FP32_LAYERS`."""
    from onnx import TensorProto

    weights = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 2}
    targets = []
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in weights:
            continue
        found = [m.groups() for p in node.metadata_props if p.key == "namespace"
                 for m in [_ENCODER_LINEAR.search(p.value)] if m]
        if found and int(found[0][0]) not in INT8_FP32_LAYERS and found[0][1] not in INT8_FP32_PROJECTIONS:
            targets.append(node.name)
    return targets


def quantize_int8(fp32_path: Path, int8_path: Path) -> int:
    """int8 matmuls in the encoder (but its first layer); the embeddings, attention, norms, the decision
    head and act head stay fp32. Returns the number of matmuls quantised.

    Each weight is rounded once to int8 per output channel (symmetric, 127 levels). Each activation
    row (token) is scaled by its own largest magnitude at run time (symmetric, 127 levels), so an
    outlier token costs no other token its resolution, and padding or other rows never enter a
    row's scale. Both are stored as uint8 around a zero point of 128 (u8u8): x86 CPUs without VNNI
    multiply u8 by s8 in 16-bit pairs that saturate (onnxruntime's dynamic u8s8 kernels lose whole
    products there), while the u8u8 kernels widen first. Per matmul:
    scale = max|x| / 127 over the row; q = QuantizeLinear(x / scale, 1, 128);
    y = MatMulIntegerToFloat(q, w_q, 1, w_scale, 128, 128) * scale."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(fp32_path), load_external_data=False)
    graph = model.graph
    targets = set(_int8_targets(graph))
    weights = {t.name: t for t in graph.initializer if t.name in {n.input[1] for n in graph.node if n.name in targets}}
    added: list = []

    def const(name: str, value: np.ndarray) -> str:
        added.append(numpy_helper.from_array(value, name))
        return name

    one, zero_point = const("int8/one", np.array(1, np.float32)), const("int8/zero_point", np.array(128, np.uint8))
    levels, tiny = const("int8/levels", np.array(127, np.float32)), const("int8/tiny", np.array(1e-30, np.float32))
    last_axis = const("int8/last_axis", np.array([-1], np.int64))
    nodes = []
    for node in graph.node:
        if node.name not in targets:
            nodes.append(node)
            continue
        x, weight_name = node.input
        weight = numpy_helper.to_array(weights[weight_name]).astype(np.float32)
        w_scale = (np.maximum(np.abs(weight).max(axis=0), 1e-30) / 127).astype(np.float32)
        w_q = (np.clip(np.round(weight / w_scale), -127, 127).astype(np.int16) + 128).astype(np.uint8)
        p = f"int8/{node.name}"
        w_q_name, w_scale_name = const(f"{p}/weight", w_q), const(f"{p}/weight_scale", w_scale)
        nodes += [
            helper.make_node("Abs", [x], [f"{p}/abs"], name=f"{p}/abs"),
            helper.make_node("ReduceMax", [f"{p}/abs", last_axis], [f"{p}/absmax"], name=f"{p}/absmax", keepdims=1),
            helper.make_node("Max", [f"{p}/absmax", tiny], [f"{p}/range"], name=f"{p}/range"),
            helper.make_node("Div", [f"{p}/range", levels], [f"{p}/scale"], name=f"{p}/scale"),
            helper.make_node("Div", [levels, f"{p}/range"], [f"{p}/inverse"], name=f"{p}/inverse"),
            helper.make_node("Mul", [x, f"{p}/inverse"], [f"{p}/scaled"], name=f"{p}/scaled"),
            helper.make_node("QuantizeLinear", [f"{p}/scaled", one, zero_point], [f"{p}/q"], name=f"{p}/q"),
            helper.make_node("MatMulIntegerToFloat", [f"{p}/q", w_q_name, one, w_scale_name, zero_point, zero_point],
                             [f"{p}/y"], name=f"{p}/matmul", domain="com.microsoft"),
            helper.make_node("Mul", [f"{p}/y", f"{p}/scale"], list(node.output), name=node.name),
        ]
        nodes[-1].metadata_props.extend(node.metadata_props)
    _rewrite(graph, nodes, added)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(int8_path))
    return len(targets)


def export_bundle(checkpoint: Checkpoint, out: Path, *, int8: bool = False,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write an ONNX bundle into `out` and return its manifest."""
    from laya.encoder.bundle import base_manifest, copy_checkpoint_files, write_manifest

    say = progress or (lambda _msg: None)
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
            manifest.update(int8_revision=INT8_REVISION, int8_fp32_layers=sorted(INT8_FP32_LAYERS),
                            int8_scheme="weights int8 per output channel, activations int8 per token (u8u8)")
            say("measuring the int8 gate against fp32")
            manifest["gate"] = measure_gate(checkpoint, fp32_path, int8_path)
            shutil.copyfile(int8_path, out / "model.onnx")
        else:
            manifest["split_products"] = split_products(fp32_path, out / "model.onnx")
    manifest["graph_sha256"] = hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest()
    write_manifest(out, manifest)
    say(f"done in {time.perf_counter() - started:.1f} s: {out}")
    return manifest


def runtime_inputs(checkpoint: Checkpoint, options: dict[str, Any], cache_dir: Path | None = None) -> dict[str, Any]:
    """What `laya.load(checkpoint, runtime="onnx", ...)` hands the runtime: a bundle exported on first use
    into a cache keyed by the checkpoint's fingerprint and the exporter's revisions (`bundle_key`)."""
    from laya.encoder.bundle import cached_export
    from laya.encoder.runtimes.onnx import check_precision

    precision = options.get("precision", "fp32")
    check_precision(precision)
    bundle = cached_export("onnx", bundle_key(checkpoint, precision),
                           lambda folder: export_bundle(checkpoint, folder, int8=precision == "int8"), cache_dir)
    return {**options, "bundle": bundle}


def bundle_key(checkpoint: Checkpoint, precision: str) -> str:
    """The cache folder's name of `checkpoint`'s bundle at `precision` (an int8 bundle of an older
    quantisation is not reused)."""
    key = f"{checkpoint.fingerprint[:16]}-{precision}-r{GRAPH_REVISION}"
    return key + (f"q{INT8_REVISION}" if precision == "int8" else "")

