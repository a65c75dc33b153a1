"""The decision network for exporters: the one torch network with the exporters' operations.

The reference runtime runs transformers' ModernBERT; exporters need a graph whose shape they control:
attention, RoPE and GeGLU's GELU as replaceable calls (`GraphOps`: ONNX Runtime's fused kernels, or
plain operations for Core ML), RoPE tables precomputed in fp32, and the head's tail batched with
traceable shapes. The layers' arithmetic is `laya.encoder.runtimes.rownet.Network`'s (laya-format.md
sections 3 and 6), which the packed and cuda runtimes run too; what is here is what exporting changes.
The parity suite checks every graph built from it against the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from laya.encoder.checkpoint import Checkpoint
from laya.encoder.runtimes.rownet import EMBEDDINGS, Linear, Network, rotate

# Head activations reach 1e3-1e4: squared inside a LayerNorm they overflow fp16. The head's norms divide
# their input by this first (LayerNorm is scale-invariant; eps is scaled to match), so an fp16 program
# (Core ML) keeps its statistics in range; in fp32 it changes nothing but the last bits.
HEAD_NORM_SCALE = 1.0 / 128.0
NEG = -1e4  # additive mask: far below any score, and finite in fp16 even doubled (Core ML); 0 * NEG is 0


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Softmax attention of [B, M, D] queries over [B, L, D] keys and values with an additive
    [B, 1, M, L] bias."""
    b, m, d = q.shape
    q = q.view(b, m, num_heads, d // num_heads).transpose(1, 2)
    k, v = (t.view(b, t.shape[1], num_heads, d // num_heads).transpose(1, 2) for t in (k, v))
    out = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // num_heads) + bias, -1) @ v
    return out.transpose(1, 2).reshape(b, m, d)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rotate-half RoPE on [B, L, D] projections from half-width tables [max_len, head_dim / 2]
    (the layout of ORT's RotaryEmbedding, whose translation this is the meaning of)."""
    b, n, d = x.shape
    c, s = torch.cat([cos[:n], cos[:n]], -1)[:, None, :], torch.cat([sin[:n], sin[:n]], -1)[:, None, :]
    return rotate(x.view(b, n, num_heads, d // num_heads), c, s).reshape(b, n, d)


@torch.library.custom_op("laya::attention", mutates_args=())
def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                    num_heads: int) -> torch.Tensor:
    """`attend` as one opaque op, so the ONNX exporter can emit ORT's fused MultiHeadAttention for it."""
    return attend(q, k, v, bias, num_heads)


@fused_attention.register_fake
def _fused_attention_shape(q, k, v, bias, num_heads):
    return torch.empty_like(q)


@torch.library.custom_op("laya::rotary", mutates_args=())
def fused_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """`rotary` as one opaque op: ORT's RotaryEmbedding in the graph instead of ~10 slices, negations,
    concatenations, products and sums per projection."""
    return rotary(x, cos, sin, num_heads)


@fused_rotary.register_fake
def _fused_rotary_shape(x, cos, sin, num_heads):
    return torch.empty_like(x)


@torch.library.custom_op("laya::gelu", mutates_args=())
def fused_gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU as one opaque op: ORT's Gelu kernel instead of five elementwise passes."""
    return F.gelu(x)


@fused_gelu.register_fake
def _fused_gelu_shape(x):
    return torch.empty_like(x)


@dataclass(frozen=True)
class GraphOps:
    """The operations an exporter may replace with fused kernels of its target: attention
    (q, k, v [B, L, D], an additive bias, heads), RoPE on [B, L, D] (`None`: the plain rotate-half on
    full-width tables, as Core ML traces it) and GeGLU's GELU. The maths is the same in every set."""

    attention: Callable = attend
    rotary: Callable | None = None
    gelu: Callable = F.gelu


PLAIN = GraphOps()
ORT_FUSED = GraphOps(attention=fused_attention, rotary=fused_rotary, gelu=fused_gelu)


def ort_translation():
    """The ONNX translations of the fused ops (onnxruntime's com.microsoft domain): MultiHeadAttention,
    RotaryEmbedding (rotate-half, positions from 0) and Gelu."""
    import onnxscript
    from onnx.defs import OpSchema

    # The onnx package carries no schemas for ORT's contrib ops: declare the part of each we use.
    def arg(name: str, optional: bool = False, kind: str = "T") -> OpSchema.FormalParameter:
        option = OpSchema.FormalParameterOption.Optional if optional else OpSchema.FormalParameterOption.Single
        return OpSchema.FormalParameter(name, kind, param_option=option)

    floats = [("T", ["tensor(float)", "tensor(float16)"], "")]

    def contrib(name: str, inputs: list, attributes: list, constraints: list = floats) -> onnxscript.values.Op:
        schema = OpSchema(name, "com.microsoft", 1, inputs=inputs, outputs=[arg("output")],
                          type_constraints=constraints, attributes=attributes)
        return onnxscript.values.Op(onnxscript.values.Opset("com.microsoft", 1), name, schema)

    heads = OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "", required=True)
    mha = contrib("MultiHeadAttention", [arg("query"), arg("key"), arg("value"), arg("bias", True),
                                         arg("key_padding_mask", True), arg("attention_bias", True)], [heads])
    rope = contrib("RotaryEmbedding", [arg("input"), arg("position_ids", kind="M"), arg("cos_cache"),
                                       arg("sin_cache")],
                   [heads, OpSchema.Attribute("interleaved", OpSchema.AttrType.INT, "", required=True)],
                   floats + [("M", ["tensor(int64)"], "")])
    gelu = contrib("Gelu", [arg("X")], [])

    def attention(q, k, v, bias, num_heads: int):
        return mha(q, k, v, None, None, bias, num_heads=num_heads)

    def rotary_embedding(x, cos, sin, num_heads: int):
        start = onnxscript.opset18.Constant(value_ints=[0])  # position s is position_ids[0] + s
        return rope(x, start, cos, sin, num_heads=num_heads, interleaved=0)

    return {torch.ops.laya.attention.default: attention, torch.ops.laya.rotary.default: rotary_embedding,
            torch.ops.laya.gelu.default: gelu}


class PortableNet(Network):
    """The one torch network (`laya.encoder.runtimes.rownet.Network`) configured for exporters: it
    takes token ids (the embedding gather in the graph), builds additive masks, runs attention, RoPE
    and GeGLU's GELU through `ops`, projects in fp32 with the bias fused (nn.Linear's arithmetic), runs
    the head's norms pre-scaled for fp16, and gives the act features no spare slot (callers give the
    marker axis at least 2). `load` builds it from a checkpoint."""

    spare_slot = False
    head_norm_scale = HEAD_NORM_SCALE

    def __init__(self, checkpoint: Checkpoint, ops: GraphOps = PLAIN):
        super().__init__(checkpoint, project=Linear)
        self.ops = ops
        # the table as stored (fp16 in a published checkpoint), widened after the gather: exact, and the
        # graph's largest initializer at half its fp32 size (an mmBERT-base's 393 MB, not 786)
        stored = np.ascontiguousarray(checkpoint.stored(EMBEDDINGS))
        self.emb = nn.Parameter(torch.from_numpy(stored), requires_grad=False)
        if ops.rotary is not None:  # the fused kernel indexes the whole half-width table by position
            half = self.head_dim // 2
            for name in ("global", "local"):
                for fn in ("cos", "sin"):
                    table = self.get_buffer(f"{name}_{fn}")[:, 0, :half].contiguous()
                    self.register_buffer(f"{name}_{fn}_half", table, persistent=False)

    @classmethod
    def load(cls, checkpoint: Checkpoint, ops: GraphOps = PLAIN) -> PortableNet:
        return cls(checkpoint, ops).eval()

    def masks(self, keep, n: int) -> dict[str, torch.Tensor]:
        b = keep.shape[0]
        keys = (1.0 - keep[:, None, None, :].float()) * NEG  # [B, 1, 1, L]
        global_bias = keys.expand(b, 1, n, n)
        pos = torch.arange(n)
        far = (pos[:, None] - pos[None, :]).abs() > self.half_window
        return {"global": global_bias, "local": global_bias + far.float()[None, None] * NEG, "head": keys}

    def attend(self, q, k, v, mask, heads: int, dtype: torch.dtype) -> torch.Tensor:
        # fused attention takes a bias with a row per query: the head's key mask is one row for all
        return self.ops.attention(q, k, v, mask.expand(-1, -1, q.shape[1], -1), heads)

    def rope(self, x: torch.Tensor, is_global: bool) -> torch.Tensor:
        if self.ops.rotary is None:
            return super().rope(x, is_global)
        name = "global" if is_global else "local"
        return self.ops.rotary(x, self.get_buffer(f"{name}_cos_half"), self.get_buffer(f"{name}_sin_half"),
                               self.heads)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.gelu(x)

    def forward(self, input_ids, attention_mask, marker_pos, marker_mask, qtype):
        """`marker_mask=None` when every marker slot is a real option (single rows: Core ML)."""
        return super().forward(F.embedding(input_ids, self.emb).float(), attention_mask, marker_pos, marker_mask,
                               qtype)
