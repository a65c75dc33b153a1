"""The decision network in plain PyTorch, written for exporters rather than for reading checkpoints.

The reference runtime runs transformers' ModernBERT; exporters need a graph whose shape they control:
attention, RoPE and GeGLU's GELU as replaceable calls (`GraphOps`: ONNX Runtime's fused kernels, or
plain operations for Core ML), RoPE tables precomputed in fp32, and the head's tail batched with
traceable shapes. Same maths as laya-format.md sections 3 and 6; the parity suite checks every graph built from
it against the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from laya.encoder.checkpoint import Checkpoint
from laya.encoder.config import EncoderConfig
from laya.encoder.head_layout import ACT_HIDDEN, MASKED_LOGIT

# Head activations reach 1e3-1e4: squared inside a LayerNorm they overflow fp16. The head's norms divide
# their input by this first (LayerNorm is scale-invariant; eps is scaled to match), so an fp16 program
# (Core ML) keeps its statistics in range; in fp32 it changes nothing but the last bits.
HEAD_NORM_SCALE = 1.0 / 128.0
NEG = -1e4  # additive mask: far below any score, and finite in fp16 even doubled (Core ML); 0 * NEG is 0


def head_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    s = HEAD_NORM_SCALE
    return F.layer_norm(x * s, norm.normalized_shape, norm.weight, norm.bias, norm.eps * s * s)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Softmax attention over [B, L, D] projections with an additive [B, 1, L, L] bias."""
    b, n, d = q.shape
    q, k, v = (t.view(b, n, num_heads, d // num_heads).transpose(1, 2) for t in (q, k, v))
    out = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // num_heads) + bias, -1) @ v
    return out.transpose(1, 2).reshape(b, n, d)


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


class Rope(nn.Module):
    """Rotate-half RoPE tables for positions 0..max_len-1, computed once in fp32 and sliced to the row
    length in the graph: an fp16 program that computed position x frequency itself would lose ~0.1 rad
    of angle at position 256."""

    def __init__(self, theta: float, head_dim: int, max_len: int):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], -1)[:, None, :]  # [L, 1, head_dim], broadcast over heads
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("cos_half", freqs.cos(), persistent=False)  # [L, head_dim / 2]: `rotary`'s
        self.register_buffer("sin_half", freqs.sin(), persistent=False)

    def tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:length], self.sin[:length]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class EncoderLayer(nn.Module):
    def __init__(self, d: int, inner: int, first: bool):
        super().__init__()
        self.attn_norm = nn.Identity() if first else nn.LayerNorm(d, eps=1e-5, bias=False)
        self.Wqkv = nn.Linear(d, 3 * d, bias=False)
        self.Wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.LayerNorm(d, eps=1e-5, bias=False)
        self.Wi = nn.Linear(d, 2 * inner, bias=False)
        self.Wo_mlp = nn.Linear(inner, d, bias=False)


class PortableNet(nn.Module):
    """Encoder, decision head and act head in plain torch operations (no `transformers` modules), so
    that it traces into ONNX and Core ML graphs; `load` fills it from a checkpoint's tensors. The
    reference network that answers and trains is `laya.encoder.runtimes.pytorch.DecisionNet`."""

    def __init__(self, enc: EncoderConfig, head_layers: int, n_act: int, max_len: int,
                 ops: GraphOps = PLAIN):
        super().__init__()
        d = enc.hidden_size
        self.enc, self.ops = enc, ops
        self.emb = nn.Embedding(enc.vocab_size, d)
        self.emb_norm = nn.LayerNorm(d, eps=1e-5, bias=False)
        self.layers = nn.ModuleList(EncoderLayer(d, enc.intermediate_size, i == 0)
                                    for i in range(enc.num_hidden_layers))
        self.final_norm = nn.LayerNorm(d, eps=1e-5, bias=False)
        self.rope_global = Rope(enc.global_rope_theta, enc.head_dim, max_len)
        self.rope_local = Rope(enc.local_rope_theta, enc.head_dim, max_len)
        from laya.encoder.runtimes.pytorch import Head

        self.head = Head(d, head_layers)
        self.type_emb = nn.Embedding(3, d)
        self.scorer = nn.Sequential(nn.LayerNorm(d, eps=1e-5), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.act_head = nn.Sequential(nn.Linear(d + 4, ACT_HIDDEN), nn.GELU(), nn.Linear(ACT_HIDDEN, n_act))

    @classmethod
    def load(cls, checkpoint: Checkpoint, ops: GraphOps = PLAIN) -> PortableNet:
        cfg = checkpoint.config
        net = cls(checkpoint.encoder, cfg.head_layers, cfg.n_act, cfg.max_len, ops)
        net.load_state_dict({ours: torch.from_numpy(checkpoint.weights[theirs]).float()
                             for ours, theirs in net.checkpoint_names().items()}, strict=True)
        return net.eval()

    def checkpoint_names(self) -> dict[str, str]:
        """Our parameter name -> the checkpoint's tensor name (the one place they are mapped)."""
        names = {"emb.weight": "encoder.embeddings.tok_embeddings.weight",
                 "emb_norm.weight": "encoder.embeddings.norm.weight",
                 "final_norm.weight": "encoder.final_norm.weight"}
        for i in range(len(self.layers)):
            ours, theirs = f"layers.{i}.", f"encoder.layers.{i}."
            pairs = {"Wqkv": "attn.Wqkv", "Wo": "attn.Wo", "mlp_norm": "mlp_norm", "Wi": "mlp.Wi",
                     "Wo_mlp": "mlp.Wo"} | ({"attn_norm": "attn_norm"} if i else {})
            names |= {f"{ours}{a}.weight": f"{theirs}{b}.weight" for a, b in pairs.items()}
        for name in self.state_dict():
            if name.split(".")[0] in ("head", "type_emb", "scorer", "act_head"):
                names[name] = name
        return names

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, n = input_ids.shape
        enc = self.enc
        heads, hd = enc.num_attention_heads, enc.head_dim
        keys = (1.0 - attention_mask[:, None, None, :].float()) * NEG  # [B, 1, 1, L]
        global_bias = keys.expand(b, 1, n, n)
        pos = torch.arange(n)
        far = (pos[:, None] - pos[None, :]).abs() > enc.local_attention // 2
        local_bias = global_bias + far.float()[None, None] * NEG
        ops = self.ops

        def rope(t: torch.Tensor, table: Rope) -> torch.Tensor:
            if ops.rotary is not None:  # the whole half-width table: the fused kernel indexes it by position
                return ops.rotary(t, table.cos_half, table.sin_half, heads)
            cos, sin = table.tables(n)
            return rotate(t.view(b, n, heads, hd), cos, sin).reshape(b, n, -1)

        x = self.emb_norm(self.emb(input_ids))
        for i, layer in enumerate(self.layers):
            is_global = enc.is_global(i)
            table = self.rope_global if is_global else self.rope_local
            q, k, v = layer.Wqkv(layer.attn_norm(x)).chunk(3, -1)  # [B, L, D] each, heads inside
            x = x + layer.Wo(ops.attention(rope(q, table), rope(k, table), v,
                                           global_bias if is_global else local_bias, heads))
            a, g = layer.Wi(layer.mlp_norm(x)).chunk(2, -1)
            x = x + layer.Wo_mlp(ops.gelu(a) * g)
        return self.final_norm(x)

    def forward(self, input_ids, attention_mask, marker_pos, marker_mask, qtype):
        """`marker_mask=None` when every marker slot is a real option (single rows: Core ML)."""
        h = self.encode(input_ids, attention_mask)
        h = h + self.type_emb(qtype)[:, None, :]
        b, n, d = h.shape
        keys = ((1.0 - attention_mask[:, None, None, :].float()) * NEG).expand(b, 1, n, n)
        for layer in self.head.layers:
            attn = layer.self_attn
            q, k, v = F.linear(head_norm(layer.norm1, h), attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
            h = h + attn.out_proj(self.ops.attention(q, k, v, keys, attn.n_heads))
            h = h + layer.linear2(F.relu(layer.linear1(head_norm(layer.norm2, h))))
        m = torch.gather(h, 1, marker_pos[:, :, None].expand(-1, -1, h.size(-1)))
        logits = self.scorer[1:](head_norm(self.scorer[0], m)).squeeze(-1).float()
        if marker_mask is None:
            k = torch.ones_like(logits).sum(-1)
        else:
            logits = logits.masked_fill(~marker_mask, MASKED_LOGIT)
            k = marker_mask.sum(-1).clamp(min=2).float()
        p = torch.softmax(logits, -1)
        entropy = -(p * torch.log(p.clamp_min(1e-9))).sum(-1) / torch.log(k)
        top = p.topk(2, -1).values  # callers give the marker axis at least 2 slots
        feats = torch.stack([top[:, 0], top[:, 0] - top[:, 1], entropy, k / 255.0], -1)
        return logits, self.act_head(torch.cat([h[:, 0].float(), feats], -1))
