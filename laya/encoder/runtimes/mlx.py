"""`runtime="mlx"`: ModernBERT / mmBERT and the decision head written natively in MLX.

No torch or transformers at inference: the weights come straight from the checkpoint's safetensors
(through `laya.encoder.checkpoint`) or from an MLX bundle (`laya export mlx`), which keeps the checkpoint's
tensor names so the mapping lives here only. fp16 by default on Apple silicon, fp32 elsewhere;
whatever the dtype, LayerNorm statistics, the head's residual stream, the scorer and the act head
run in fp32 (head activations reach 1e3-1e4).

Speed: the forward is `mx.compile`d; rows are padded to a small set of lengths (`mlx_length`) so a
handful of compiled graphs serve every request, and the sliding-window and padding masks are built
once per length and batch composition inside the compiled graph.
"""

from __future__ import annotations

import math
import platform
import sys

import numpy as np

from laya.encoder.batch import Batch
from laya.encoder.bundle import is_bundle, read_manifest
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.head_layout import MASKED_LOGIT
from laya.encoder.runtimes.base import RuntimeBase
from laya.errors import CheckpointError

PRECISIONS = ("auto", "fp32", "fp16")
NEG = {"fp32": -1e9, "fp16": -3e4}  # additive mask: twice it must stay finite in the dtype (no NaN rows)
WEIGHTS = "weights.safetensors"


def on_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mlx_length(n: int) -> int:
    """Pad lengths to 32, 64, 96, 128, then 1.5x/2x steps (192, 256, 384, 512, ...): few compiled graphs."""
    if n <= 128:
        return max(32, -(-n // 32) * 32)
    size = 128
    while True:
        for step in (size * 3 // 2, size * 2):
            if n <= step:
                return step
        size *= 2


class MlxRuntime(RuntimeBase):
    name = "mlx"

    def __init__(self, checkpoint: Checkpoint, precision: str = "auto", compile: bool = True):
        import mlx.core as mx

        _warn_about_reference_blas()
        if precision not in PRECISIONS:
            raise CheckpointError(f"MLX precision must be one of {PRECISIONS}, got {precision!r}")
        if is_bundle(checkpoint.path):
            manifest = read_manifest(checkpoint.path)
            if manifest.get("kind") != "mlx":
                raise CheckpointError(f"{checkpoint.path}: a {manifest.get('kind')!r} bundle, not an MLX one")
            tensors = dict(mx.load(str(checkpoint.path / WEIGHTS)))  # type: ignore[arg-type]  # safetensors: a dict
            stored = manifest["precision"]
        else:
            tensors = {k: mx.array(v) for k, v in checkpoint.weights.items()}
            stored = "fp32"
        if precision == "auto":
            precision = stored if is_bundle(checkpoint.path) else ("fp16" if on_apple_silicon() else "fp32")
        if stored == "fp16" and precision == "fp32":
            raise CheckpointError(f"{checkpoint.path}: an fp16 MLX bundle cannot run in fp32; export an fp32 one")
        self.precision = precision
        self.dtype = mx.float16 if precision == "fp16" else mx.float32
        self.enc = checkpoint.encoder
        self.p = _arrange(tensors, checkpoint, self.dtype)
        mx.eval(self.p)
        self._forward = mx.compile(self._graph) if compile else self._graph

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        import mlx.core as mx

        n = batch.length
        length = mlx_length(n)
        ids = np.pad(batch.input_ids, ((0, 0), (0, length - n)), constant_values=0)
        att = np.pad(batch.attention_mask, ((0, 0), (0, length - n)))
        pos, mask = batch.marker_pos, batch.marker_mask
        if pos.shape[1] < 2:  # the act features take the top two options
            pos, mask = np.pad(pos, ((0, 0), (0, 2 - pos.shape[1]))), np.pad(mask, ((0, 0), (0, 2 - mask.shape[1])))
        inputs = (ids.astype(np.int32), att.astype(np.float32), pos.astype(np.int32), mask,
                  batch.qtype.astype(np.int32))
        logits, act = self._forward(self.p, *(mx.array(x) for x in inputs))
        mx.eval(logits, act)
        return np.array(logits)[:, : batch.n_markers], np.array(act)

    # The network. `p` is the arranged parameter tree; every function below is pure, so it compiles.
    def _graph(self, p, ids, att, pos, mask, qtype):
        import mlx.core as mx

        f32, dt, enc = mx.float32, self.dtype, self.enc
        b, n = ids.shape
        heads, hd = enc.num_attention_heads, enc.head_dim
        neg = NEG[self.precision]
        keys = ((1.0 - att) * neg)[:, None, None, :]  # [B, 1, 1, L]
        idx = mx.arange(n)
        far = mx.abs(idx[:, None] - idx[None, :]) > enc.local_attention // 2
        local = keys + mx.where(far, neg, 0.0)[None, None]
        masks = {True: keys.astype(dt), False: local.astype(dt)}
        x = _norm(p["emb"][ids], p["emb_norm"], None).astype(dt)
        for i, layer in enumerate(p["layers"]):
            is_global = enc.is_global(i)
            h = x if i == 0 else _norm(x, layer["attn_norm"], None).astype(dt)
            qkv = (h @ layer["Wqkv"]).reshape(b, n, 3, heads, hd).transpose(2, 0, 3, 1, 4)
            theta = enc.global_rope_theta if is_global else enc.local_rope_theta
            q = mx.fast.rope(qkv[0], hd, traditional=False, base=theta, scale=1.0, offset=0)
            k = mx.fast.rope(qkv[1], hd, traditional=False, base=theta, scale=1.0, offset=0)
            a = mx.fast.scaled_dot_product_attention(q, k, qkv[2], scale=1.0 / math.sqrt(hd), mask=masks[is_global])
            x = x + a.transpose(0, 2, 1, 3).reshape(b, n, -1) @ layer["Wo"]
            gate_in, gate = mx.split(_norm(x, layer["mlp_norm"], None).astype(dt) @ layer["Wi"], 2, axis=-1)
            x = x + (_gelu(gate_in) * gate) @ layer["Wo_mlp"]
        h = _norm(x, p["final_norm"], None) + p["type_emb"][qtype][:, None, :]  # fp32 from here on
        head_mask = keys.astype(dt)
        for layer in p["head"]:
            nh = h.shape[-1] // 64 or 1
            z = _norm(h, *layer["norm1"]).astype(dt)
            q, k, v = mx.split(z @ layer["in_w"] + layer["in_b"], 3, axis=-1)
            q, k, v = (t.reshape(b, n, nh, -1).transpose(0, 2, 1, 3) for t in (q, k, v))
            a = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), mask=head_mask)
            h = h + (a.transpose(0, 2, 1, 3).reshape(b, n, -1) @ layer["out_w"] + layer["out_b"]).astype(f32)
            z = _norm(h, *layer["norm2"]).astype(dt)
            h = h + (mx.maximum(z @ layer["l1_w"] + layer["l1_b"], 0) @ layer["l2_w"] + layer["l2_b"]).astype(f32)
        m = mx.take_along_axis(h, pos[:, :, None], axis=1)  # [B, K, d] fp32
        s = p["scorer"]
        z = _gelu(_norm(m, s["norm_w"], s["norm_b"]) @ s["w1"] + s["b1"])
        logits = mx.where(mask, (z @ s["w2"] + s["b2"])[..., 0], MASKED_LOGIT)
        probs = mx.softmax(logits, axis=-1)
        k = mx.maximum(mask.sum(-1), 2).astype(f32)
        entropy = -(probs * mx.log(mx.maximum(probs, 1e-9))).sum(-1) / mx.log(k)
        top = mx.sort(probs, axis=-1)[:, ::-1][:, :2]
        feats = mx.stack([top[:, 0], top[:, 0] - top[:, 1], entropy, k / 255.0], -1)
        a = p["act"]
        act = _gelu(mx.concatenate([h[:, 0], feats], -1) @ a["w1"] + a["b1"]) @ a["w2"] + a["b2"]
        return logits, act


def _warn_about_reference_blas() -> None:
    """MLX's Linux CPU wheel multiplies with a reference BLAS (~6 GFLOP/s here, ~30x slower than OpenBLAS)."""
    import os
    import warnings

    if sys.platform == "linux" and "openblas" not in os.environ.get("LD_PRELOAD", ""):
        warnings.warn("MLX on Linux runs its matmuls on a slow reference BLAS; preload an optimized one, e.g. "
                      "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 (Debian's "
                      "libopenblas0-pthread). See docs/runtimes.md.", RuntimeWarning, stacklevel=3)


def _norm(x, weight, bias, eps: float = 1e-5):
    """LayerNorm with fp32 statistics whatever the input dtype."""
    import mlx.core as mx

    return mx.fast.layer_norm(x.astype(mx.float32), weight, bias, eps)


def _gelu(x):
    import mlx.core as mx

    return x * (1.0 + mx.erf(x / math.sqrt(2.0))) * 0.5


def _arrange(t: dict, checkpoint: Checkpoint, dtype) -> dict:
    """The checkpoint's tensor names -> the tree the graph reads (matmul weights transposed once).

    The one place checkpoint names are mapped for MLX. Norms, the head's biases, the scorer and the
    act head stay fp32; the encoder's and head's matmul weights take the runtime dtype."""
    import mlx.core as mx

    f32 = mx.float32

    def w(name, kind=dtype):
        return t[name].astype(kind)

    def lin(name, kind=dtype):  # stored [out, in] like torch; the graph multiplies x @ W
        return t[name].astype(kind).T

    layers = []
    for i in range(checkpoint.encoder.num_hidden_layers):
        pre = f"encoder.layers.{i}."
        layer = {"Wqkv": lin(pre + "attn.Wqkv.weight"), "Wo": lin(pre + "attn.Wo.weight"),
                 "mlp_norm": w(pre + "mlp_norm.weight", f32), "Wi": lin(pre + "mlp.Wi.weight"),
                 "Wo_mlp": lin(pre + "mlp.Wo.weight")}
        if i:
            layer["attn_norm"] = w(pre + "attn_norm.weight", f32)
        layers.append(layer)
    head = []
    for i in range(checkpoint.config.head_layers):
        pre = f"head.layers.{i}."
        head.append({
            "norm1": (w(pre + "norm1.weight", f32), w(pre + "norm1.bias", f32)),
            "norm2": (w(pre + "norm2.weight", f32), w(pre + "norm2.bias", f32)),
            "in_w": lin(pre + "self_attn.in_proj_weight"), "in_b": w(pre + "self_attn.in_proj_bias"),
            "out_w": lin(pre + "self_attn.out_proj.weight"), "out_b": w(pre + "self_attn.out_proj.bias"),
            "l1_w": lin(pre + "linear1.weight"), "l1_b": w(pre + "linear1.bias"),
            "l2_w": lin(pre + "linear2.weight"), "l2_b": w(pre + "linear2.bias"),
        })
    return {
        "emb": w("encoder.embeddings.tok_embeddings.weight"),
        "emb_norm": w("encoder.embeddings.norm.weight", f32),
        "final_norm": w("encoder.final_norm.weight", f32),
        "layers": layers,
        "head": head,
        "type_emb": w("type_emb.weight", f32),
        "scorer": {"norm_w": w("scorer.0.weight", f32), "norm_b": w("scorer.0.bias", f32),
                   "w1": lin("scorer.1.weight", f32), "b1": w("scorer.1.bias", f32),
                   "w2": lin("scorer.3.weight", f32), "b2": w("scorer.3.bias", f32)},
        "act": {"w1": lin("act_head.0.weight", f32), "b1": w("act_head.0.bias", f32),
                "w2": lin("act_head.2.weight", f32), "b2": w("act_head.2.bias", f32)},
    }
