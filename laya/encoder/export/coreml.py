"""`laya export coreml`: Core ML bundles, a general one and fixed-shape Neural Engine ones.

General (`general.mlpackage`): an ML Program over the plain-torch network (`torch_net.PortableNet`,
exported with torch.export and core-ATen decompositions), batch 1, enumerated sequence lengths
(16 ... max_len) and a marker axis of 2 to 255 options. fp16 compute by default, fp32 on request.
Inputs `input_ids (1, L)`, `n_tokens (1,)` (the row's real length: the mask is built in the graph,
as Core ML allows one enumerated input before iOS 18), `marker_pos (1, K)`, `qtype (1,)`; outputs
`logits (1, K)` and `act_logits (1, n_act)`.

Neural Engine (`--ane`, `ane-L{64,96,128[,256]}.mlpackage`): the channel-first `ane_net.AneNet`,
fp16, B = 1, fixed L, 32 option slots; the host gathers embeddings, builds masks and runs the act
head from `host.safetensors`. A row that fits no bucket goes to the general bundle, never truncated.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.checkpoint import Checkpoint
from laya.errors import CheckpointError

GENERAL = "general.mlpackage"
HOST_WEIGHTS = "host.safetensors"
ANE_BUCKETS = (64, 96, 128)
ANE_BUCKETS_MULTILINGUAL = (64, 96, 128, 256)
GENERAL_INPUTS = ["input_ids", "n_tokens", "marker_pos", "qtype"]
ANE_INPUTS = ["embeddings", "type_vector", "global_mask", "local_mask", "markers"]
MAX_MARKERS = 255
DEPLOYMENT = "iOS17"  # ML Program opset CoreML7 (macOS 14)
# Bumped whenever the converted programs change, so cached bundles from an older exporter are not reused.
PROGRAM_REVISION = 4


LENGTHS = (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def general_lengths(max_len: int) -> list[int]:
    """The enumerated lengths of the general program: 16 ... max_len (max_len always included)."""
    out = [n for n in LENGTHS if n < max_len]
    return out + [max_len]


def ane_buckets(checkpoint: Checkpoint) -> tuple[int, ...]:
    """64, 96, 128; and 256 for the multilingual (mmBERT) family, whose prompts tokenise longer. The
    family is told by mmBERT's special-id layout (pad 0, sep 1, cls 2, mask 4)."""
    tok = checkpoint.tokenizer
    multilingual = (tok.pad_id, tok.sep_id, tok.cls_id, tok.mask_id) == (0, 1, 2, 4)
    buckets = ANE_BUCKETS_MULTILINGUAL if multilingual else ANE_BUCKETS
    return tuple(b for b in buckets if b <= checkpoint.config.max_len)


def _quiet():
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="coremltools")


@contextlib.contextmanager
def _silenced():
    """coremltools draws progress bars on stderr for every pass; errors still raise."""
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _ct():
    try:
        import coremltools as ct
    except ImportError as exc:
        raise CheckpointError("exporting Core ML bundles needs coremltools: "
                              "pip install 'laya-runtime[coreml]'") from exc
    _quiet()
    return ct


def general_module(checkpoint: Checkpoint):
    """The batch-1 network the general bundle is converted from (also what its parity is checked on)."""
    import torch
    from torch import nn

    from laya.encoder.export.torch_net import PortableNet

    net = PortableNet.load(checkpoint)

    class General(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, input_ids, n_tokens, marker_pos, qtype):
            mask = (torch.arange(input_ids.shape[1])[None, :] < n_tokens[:, None]).long()
            return self.net(input_ids.long(), mask, marker_pos.long(), None, qtype.long())

    return General().eval()


def convert_general(checkpoint: Checkpoint, path: Path, precision: str = "fp16") -> None:
    import torch

    ct = _ct()
    lengths = general_lengths(checkpoint.config.max_len)
    module = general_module(checkpoint)
    example = (torch.ones(1, 32, dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
               torch.tensor([[1, 2, 3]], dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    length = torch.export.Dim("length", min=min(lengths), max=max(lengths))
    markers = torch.export.Dim("markers", min=2, max=MAX_MARKERS)
    with torch.no_grad(), _silenced():
        program = torch.export.export(module, example, dynamic_shapes={
            "input_ids": {1: length}, "n_tokens": None, "marker_pos": {1: markers}, "qtype": None})
        program = program.run_decompositions({})
        seq = ct.EnumeratedShapes(shapes=[(1, n) for n in lengths], default=(1, lengths[0]))
        k = ct.RangeDim(lower_bound=2, upper_bound=MAX_MARKERS, default=2)
        model = ct.convert(
            program,
            inputs=[ct.TensorType(name="input_ids", shape=seq, dtype=np.int32),
                    ct.TensorType(name="n_tokens", shape=(1,), dtype=np.int32),
                    ct.TensorType(name="marker_pos", shape=(1, k), dtype=np.int32),
                    ct.TensorType(name="qtype", shape=(1,), dtype=np.int32)],
            outputs=[ct.TensorType(name="logits", dtype=np.float32),
                     ct.TensorType(name="act_logits", dtype=np.float32)],
            convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, DEPLOYMENT),
            compute_precision=ct.precision.FLOAT16 if precision == "fp16" else ct.precision.FLOAT32,
            skip_model_load=True)
    model.save(str(path))


def convert_ane(checkpoint: Checkpoint, length: int, path: Path) -> None:
    import torch

    from laya.encoder.export.ane_net import SLOTS, AneNet

    ct = _ct()
    d = checkpoint.encoder.hidden_size
    net = AneNet(checkpoint.weights, checkpoint.encoder, checkpoint.config.head_layers, length).eval()
    example = (torch.zeros(1, d, 1, length), torch.zeros(1, d, 1, 1), torch.zeros(1, 1, 1, length),
               torch.zeros(1, 1, length, length), torch.zeros(1, length, SLOTS))
    with torch.no_grad(), _silenced():
        traced = torch.jit.trace(net, example)
        model = ct.convert(
            traced,
            inputs=[ct.TensorType(name=n, shape=tuple(e.shape), dtype=np.float16)
                    for n, e in zip(ANE_INPUTS, example)],
            outputs=[ct.TensorType(name="logits", dtype=np.float16), ct.TensorType(name="cls", dtype=np.float16)],
            convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, DEPLOYMENT),
            compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    model.save(str(path))


def write_host_weights(checkpoint: Checkpoint, path: Path) -> None:
    """What the host computes for the Neural Engine bundles: embedding table (fp16: it is only
    gathered), type vectors and act head (fp32)."""
    from safetensors.numpy import save_file

    w = checkpoint.weights
    table = "encoder.embeddings.tok_embeddings.weight"
    tensors = {table: w[table].astype(np.float16)}
    for name in ("type_emb.weight", "act_head.0.weight", "act_head.0.bias", "act_head.2.weight", "act_head.2.bias"):
        tensors[name] = np.ascontiguousarray(w[name], dtype=np.float32)
    save_file(tensors, str(path))


def export_bundle(checkpoint: Checkpoint, out: Path, *, precision: str = "fp16", ane: bool = False,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write a Core ML bundle (general program, plus Neural Engine buckets with `ane`) into `out`."""
    from laya.encoder.bundle import base_manifest, copy_checkpoint_files, write_manifest

    if precision not in ("fp16", "fp32"):
        raise CheckpointError(f"Core ML precision must be fp16 or fp32, got {precision!r}")
    say = progress or (lambda _msg: None)
    copy_checkpoint_files(checkpoint, out)
    manifest = base_manifest(checkpoint, "coreml", precision)
    lengths = general_lengths(checkpoint.config.max_len)
    with tempfile.TemporaryDirectory() as tmp:
        say(f"converting the general program ({precision}, lengths {lengths})")
        convert_general(checkpoint, Path(tmp) / GENERAL, precision)
        _replace(Path(tmp) / GENERAL, out / GENERAL)
        buckets: list[int] = []
        if ane:
            for length in ane_buckets(checkpoint):
                say(f"converting the Neural Engine program for {length} tokens")
                name = f"ane-L{length}.mlpackage"
                convert_ane(checkpoint, length, Path(tmp) / name)
                _replace(Path(tmp) / name, out / name)
                buckets.append(length)
            write_host_weights(checkpoint, out / HOST_WEIGHTS)
    from laya.encoder.export.ane_net import SLOTS

    manifest.update(
        deployment_target=DEPLOYMENT,
        general={"program": GENERAL, "lengths": lengths, "max_markers": MAX_MARKERS, "inputs": GENERAL_INPUTS,
                 "outputs": ["logits", "act_logits"]},
        ane=({"buckets": [{"length": n, "program": f"ane-L{n}.mlpackage"} for n in buckets], "slots": SLOTS,
              "inputs": ANE_INPUTS, "outputs": ["logits", "cls"], "host_weights": HOST_WEIGHTS, "precision": "fp16"}
             if ane else None),
    )
    write_manifest(out, manifest)
    say(f"done: {out}")
    return manifest


def _replace(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.move(str(src), str(dst))


def torch_programs(checkpoint: Checkpoint, ane: bool = True):
    """The fp32 torch modules each program is converted from, behind the runtime's predictor shape
    (`executor="torch"`: checks the conversion without Core ML)."""
    import torch

    from laya.encoder.export.ane_net import SLOTS, AneNet
    from laya.encoder.runtimes.coreml import HostParts, Programs

    def wrap(module, names, outputs):
        def predict(feeds):
            with torch.no_grad():
                result = module(*[torch.from_numpy(np.asarray(feeds[n])) for n in names])
            return {k: v.numpy() for k, v in zip(outputs, result)}
        return predict

    if not checkpoint.weights:
        raise CheckpointError(f"{checkpoint.path}: executor='torch' needs the checkpoint's weights, not a bundle")
    programs = Programs(general=wrap(general_module(checkpoint), GENERAL_INPUTS, ["logits", "act_logits"]),
                        lengths=general_lengths(checkpoint.config.max_len), max_markers=MAX_MARKERS)
    if ane:
        w, enc = checkpoint.weights, checkpoint.encoder
        programs.slots = SLOTS
        programs.host = HostParts(w, enc.local_attention, checkpoint.tokenizer.pad_id)
        for length in ane_buckets(checkpoint):
            net = AneNet(w, enc, checkpoint.config.head_layers, length).eval()
            programs.buckets[length] = wrap(net, ANE_INPUTS, ["logits", "cls"])
    return programs


def runtime_inputs(checkpoint: Checkpoint, options: dict[str, Any], cache_dir: Path | None = None) -> dict[str, Any]:
    """What `laya.load(checkpoint, runtime="coreml", ...)` hands the runtime: a bundle converted on first
    use into the cache, or (executor="torch") the torch programs."""
    from laya.encoder.runtimes.coreml import check_options

    check_options(options.get("executor", "coreml"), options.get("compute_units", "cpu_and_gpu"))
    ane = options.get("ane", True)
    if options.get("executor") == "torch":
        return {**options, "programs": torch_programs(checkpoint, ane)}
    from laya.encoder.bundle import cached_export

    precision = options.get("precision", "fp16")
    key = f"{checkpoint.fingerprint[:16]}-{precision}{'-ane' if ane else ''}-r{PROGRAM_REVISION}"
    bundle = cached_export("coreml", key, lambda folder: export_bundle(checkpoint, folder, precision=precision,
                                                                       ane=ane), cache_dir)
    return {**options, "bundle": bundle}

