"""The decision network laid out for the Apple Neural Engine: channel-first, fixed shapes.

Tensors are `(1, C, 1, L)`, every Linear is a 1x1 convolution, the batch is 1 and the length L is
fixed per bundle (a "bucket"); at most `SLOTS` option markers. The host does what the Neural Engine
does badly or what must stay fp32 (laya-format.md section 7): it gathers the token embeddings, hands
in the question type's vector and the additive masks, and runs the act head on the returned CLS
vector. A plain (B, L, C) export gives wrong answers on the Neural Engine without raising, so this
layout is the only one shipped for it.

fp16 safety: head activations reach 1e3-1e4, whose squares overflow fp16 inside a LayerNorm. Every
LayerNorm here divides its input by a constant first (LayerNorm is scale-invariant; eps is scaled to
match), so its statistics stay in range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from laya.encoder.config import EncoderConfig
from laya.encoder.export.torch_net import HEAD_NORM_SCALE
from laya.encoder.runtimes.rownet import rope_tables, rotate

SLOTS = 32  # option markers per row on the Neural Engine
ENCODER_NORM_SCALE = 1.0


def _conv(weight: np.ndarray, bias: np.ndarray | None = None) -> nn.Conv2d:
    out_c, in_c = weight.shape
    conv = nn.Conv2d(in_c, out_c, 1, bias=bias is not None)
    conv.weight.data = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32))[:, :, None, None]
    if bias is not None:
        conv.bias.data = torch.from_numpy(np.asarray(bias, dtype=np.float32))
    return conv


class ChannelNorm(nn.Module):
    """LayerNorm over the channel axis of (1, C, 1, L), with a constant pre-scale for fp16 range."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, scale: float, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(np.asarray(weight, np.float32))[None, :, None, None])
        self.bias = None if bias is None else \
            nn.Parameter(torch.from_numpy(np.asarray(bias, np.float32))[None, :, None, None])
        self.scale, self.eps = scale, eps * scale * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale if self.scale != 1.0 else x
        centred = x - x.mean(dim=1, keepdim=True)
        y = centred * torch.rsqrt((centred * centred).mean(dim=1, keepdim=True) + self.eps) * self.weight
        return y if self.bias is None else y + self.bias


def _attention(q, k, v, mask, heads: int, c: int, n: int) -> torch.Tensor:
    """q, k, v (1, C, 1, L) -> (1, C, 1, L); `mask` additive, broadcast to (1, H, L, L). Shapes are
    passed as Python ints: fixed per bundle, and a traced shape would become a graph computation."""
    hd = c // heads
    q, k, v = (t.reshape(1, heads, hd, n) for t in (q, k, v))
    scores = torch.matmul(q.transpose(2, 3), k) * (1.0 / math.sqrt(hd)) + mask  # (1, H, Lq, Lk)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(v, probs.transpose(2, 3)).reshape(1, c, 1, n)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, c: int, n: int) -> torch.Tensor:
    """RoPE on (1, C, 1, L): a head's channels are axis 2 of (1, H, hd, L)."""
    hd = c // heads
    return rotate(x.reshape(1, heads, hd, n), cos, sin, 2, hd // 2).reshape(1, c, 1, n)


class AneEncoderLayer(nn.Module):
    def __init__(self, w: Mapping[str, np.ndarray], i: int, enc: EncoderConfig, length: int):
        super().__init__()
        self.c, self.n = enc.hidden_size, length
        p = f"encoder.layers.{i}."
        self.attn_norm = ChannelNorm(w[p + "attn_norm.weight"], None, ENCODER_NORM_SCALE) if i else None
        self.Wqkv, self.Wo = _conv(w[p + "attn.Wqkv.weight"]), _conv(w[p + "attn.Wo.weight"])
        self.mlp_norm = ChannelNorm(w[p + "mlp_norm.weight"], None, ENCODER_NORM_SCALE)
        self.Wi, self.Wo_mlp = _conv(w[p + "mlp.Wi.weight"]), _conv(w[p + "mlp.Wo.weight"])
        self.is_global = enc.is_global(i)
        self.heads, self.inner = enc.num_attention_heads, enc.intermediate_size

    def forward(self, x, cos, sin, mask):
        h = x if self.attn_norm is None else self.attn_norm(x)
        q, k, v = self.Wqkv(h).chunk(3, dim=1)
        q, k = (_rotate(t, cos, sin, self.heads, self.c, self.n) for t in (q, k))
        x = x + self.Wo(_attention(q, k, v, mask, self.heads, self.c, self.n))
        a, g = self.Wi(self.mlp_norm(x)).chunk(2, dim=1)
        return x + self.Wo_mlp(F.gelu(a) * g)


class AneHeadLayer(nn.Module):
    def __init__(self, w: Mapping[str, np.ndarray], i: int, d: int, length: int):
        super().__init__()
        self.c, self.n = d, length
        p = f"head.layers.{i}."
        self.norm1 = ChannelNorm(w[p + "norm1.weight"], w[p + "norm1.bias"], HEAD_NORM_SCALE)
        self.norm2 = ChannelNorm(w[p + "norm2.weight"], w[p + "norm2.bias"], HEAD_NORM_SCALE)
        self.in_proj = _conv(w[p + "self_attn.in_proj_weight"], w[p + "self_attn.in_proj_bias"])
        self.out_proj = _conv(w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"])
        self.linear1 = _conv(w[p + "linear1.weight"], w[p + "linear1.bias"])
        self.linear2 = _conv(w[p + "linear2.weight"], w[p + "linear2.bias"])
        self.heads = max(1, d // 64)

    def forward(self, h, mask):
        q, k, v = self.in_proj(self.norm1(h)).chunk(3, dim=1)
        h = h + self.out_proj(_attention(q, k, v, mask, self.heads, self.c, self.n))
        return h + self.linear2(F.relu(self.linear1(self.norm2(h))))


class AneNet(nn.Module):
    """Inputs: `embeddings` (1, C, 1, L) gathered by the host, `type_vector` (1, C, 1, 1),
    `global_mask` (1, 1, 1, L) and `local_mask` (1, 1, L, L) additive, `markers` (1, L, SLOTS)
    one-hot. Outputs: `logits` (1, SLOTS) and `cls` (1, C), the CLS vector for the host's act head."""

    def __init__(self, w: Mapping[str, np.ndarray], enc: EncoderConfig, head_layers: int, length: int):
        super().__init__()
        d = enc.hidden_size
        self.length, self.d = length, d
        self.emb_norm = ChannelNorm(w["encoder.embeddings.norm.weight"], None, ENCODER_NORM_SCALE)
        self.layers = nn.ModuleList(AneEncoderLayer(w, i, enc, length) for i in range(enc.num_hidden_layers))
        self.final_norm = ChannelNorm(w["encoder.final_norm.weight"], None, ENCODER_NORM_SCALE)
        self.head = nn.ModuleList(AneHeadLayer(w, i, d, length) for i in range(head_layers))
        self.scorer_norm = ChannelNorm(w["scorer.0.weight"], w["scorer.0.bias"], HEAD_NORM_SCALE)
        self.scorer1 = _conv(w["scorer.1.weight"], w["scorer.1.bias"])
        self.scorer2 = _conv(w["scorer.3.weight"], w["scorer.3.bias"])
        for name, theta in (("global", enc.global_rope_theta), ("local", enc.local_rope_theta)):
            cos, sin = rope_tables(theta, enc.head_dim, length)  # as (1, 1, hd, L) constants
            self.register_buffer(f"cos_{name}", cos.T[None, None])
            self.register_buffer(f"sin_{name}", sin.T[None, None])

    def forward(self, embeddings, type_vector, global_mask, local_mask, markers):
        x = self.emb_norm(embeddings)
        for layer in self.layers:
            if layer.is_global:
                x = layer(x, self.cos_global, self.sin_global, global_mask)
            else:
                x = layer(x, self.cos_local, self.sin_local, local_mask)
        h = self.final_norm(x) + type_vector
        for layer in self.head:
            h = layer(h, global_mask)
        c = self.d
        picked = torch.matmul(h.reshape(1, c, self.length), markers).reshape(1, c, 1, SLOTS)
        z = self.scorer2(F.gelu(self.scorer1(self.scorer_norm(picked))))  # (1, 1, 1, SLOTS)
        return z.reshape(1, SLOTS), h[:, :, 0, 0]
