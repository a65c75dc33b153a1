"""The decision network written for speed: plain torch over rows that are packed, not padded.

The reference runtime (`pytorch.py`) runs transformers' ModernBERT over a padded batch in fp32. This
network computes the same maths (laya-format.md sections 3 and 6) the way a fast runtime wants it:

- A batch of one row at its exact length needs no padding mask: global layers attend without any
  mask, local ones with the band alone (the fused attention kernels run a masked full product faster
  than blocked windows up to about 600 tokens here). With several padded rows (a GPU's buckets), key
  masks come back and padded queries see every valid key, as in the reference.
- The matrix products run in the plan's precision (`Plan`): bf16 or fp16 on matrix units, fp32 for
  the exact path; the residual stream, every LayerNorm, RoPE, the scorer and the act head stay fp32,
  and the plan may keep the first encoder layers wholly fp32 (rounding there is carried through all
  the later ones).
- The last head layer is read only where it is used: its queries, attention output and feed-forward
  at the CLS position and the option markers, its keys and values over the whole row.

`RowNet` takes embeddings already gathered (the table stays outside the graph a compiler sees), so
the same module runs eagerly, ahead-of-time compiled (`compiled.py`), and on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from laya.encoder.checkpoint import Checkpoint
from laya.encoder.head_layout import ACT_HIDDEN, MASKED_LOGIT

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
HEAD_EPS = 1e-5


@dataclass(frozen=True)
class Plan:
    """What runs in which precision: the encoder's projections in `matmul` (fp32, bf16, fp16, or int8:
    int8 weights per output channel, activations scaled per token as they come), attention and the
    decision head's projections in `attention` (a float type), except the first `fp32_layers` encoder
    layers, which run wholly in fp32."""

    matmul: str = "fp32"
    attention: str = "fp32"
    fp32_layers: int = 0

    @property
    def label(self) -> str:
        """The precision a user names: the encoder's projections, where the arithmetic is."""
        return self.matmul

    def describe(self) -> str:
        if self.matmul == self.attention == "fp32":
            return "fp32"
        text = f"{self.matmul} projections, {self.attention} attention and head"
        if self.fp32_layers:
            text += f", the first {self.fp32_layers} encoder layer{'s' if self.fp32_layers > 1 else ''} in fp32"
        return text


def _param(array, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    return nn.Parameter(torch.as_tensor(array).to(dtype).contiguous(), requires_grad=False)


class Projection(nn.Module):
    """x @ W^T (+ b) in one precision, handed back as fp32 (the bias is fp32).

    int8: the weight is rounded once per output channel (symmetric, 127 levels) and stored transposed
    for `torch._int_mm`; each activation row is scaled by its own largest magnitude as it comes."""

    def __init__(self, weight, bias, kind: str):
        super().__init__()
        self.kind = kind
        w = torch.as_tensor(weight).float()
        if kind == "int8":
            scale = w.abs().amax(1).clamp_min(1e-12) / 127.0
            self.weight = nn.Parameter(torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).t().contiguous(),
                                       requires_grad=False)
            self.scale = nn.Parameter(scale, requires_grad=False)
        else:
            self.weight = nn.Parameter(w.to(DTYPES[kind]).contiguous(), requires_grad=False)
        self.bias = None if bias is None else _param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "int8":
            s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127.0
            q = torch.round(x / s).clamp(-127, 127).to(torch.int8)
            y = torch._int_mm(q.reshape(-1, q.shape[-1]), self.weight).view(*x.shape[:-1], -1).float()
            y = y * s * self.scale
        else:
            y = F.linear(x.to(self.weight.dtype), self.weight).float()
        return y if self.bias is None else y + self.bias


def _rope_tables(theta: float, head_dim: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of [B, L, H, hd] fp32 projections by [L, hd] tables."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class EncoderLayer(nn.Module):
    def __init__(self, weights, prefix: str, first: bool, kind: str):
        super().__init__()
        self.attn_norm = None if first else _param(weights[prefix + "attn_norm.weight"])
        self.wqkv = Projection(weights[prefix + "attn.Wqkv.weight"], None, kind)
        self.wo = Projection(weights[prefix + "attn.Wo.weight"], None, kind)
        self.mlp_norm = _param(weights[prefix + "mlp_norm.weight"])
        self.wi = Projection(weights[prefix + "mlp.Wi.weight"], None, kind)
        self.wo_mlp = Projection(weights[prefix + "mlp.Wo.weight"], None, kind)


class HeadLayer(nn.Module):
    def __init__(self, weights, prefix: str, kind: str):
        super().__init__()
        for ours, theirs in (("qkv", "self_attn.in_proj"), ("out", "self_attn.out_proj"), ("up", "linear1"),
                             ("down", "linear2")):
            joint = "_" if theirs.endswith("in_proj") else "."
            setattr(self, ours, Projection(weights[prefix + theirs + joint + "weight"],
                                           weights[prefix + theirs + joint + "bias"], kind))
        for ours, theirs in (("n1w", "norm1.weight"), ("n1b", "norm1.bias"), ("n2w", "norm2.weight"),
                             ("n2b", "norm2.bias")):
            setattr(self, ours, _param(weights[prefix + theirs]))


class RowNet(nn.Module):
    """Encoder (from gathered embeddings), decision head, scorer and act head of a checkpoint."""

    def __init__(self, checkpoint: Checkpoint, plan: Plan = Plan()):
        super().__init__()
        w, enc, cfg = checkpoint.weights, checkpoint.encoder, checkpoint.config
        self.plan, self.enc = plan, enc
        self.d, self.heads, self.head_dim = enc.hidden_size, enc.num_attention_heads, enc.head_dim
        self.eps, self.half_window = enc.norm_eps, enc.local_attention // 2
        self.emb_norm = _param(w["encoder.embeddings.norm.weight"])
        self.final_norm = _param(w["encoder.final_norm.weight"])
        self.layers = nn.ModuleList(
            EncoderLayer(w, f"encoder.layers.{i}.", i == 0, "fp32" if i < plan.fp32_layers else plan.matmul)
            for i in range(enc.num_hidden_layers))
        self.globals = [enc.is_global(i) for i in range(enc.num_hidden_layers)]
        for name, theta in (("global", enc.global_rope_theta), ("local", enc.local_rope_theta)):
            cos, sin = _rope_tables(theta, self.head_dim, cfg.max_len)
            self.register_buffer(f"{name}_cos", cos, persistent=False)
            self.register_buffer(f"{name}_sin", sin, persistent=False)
        self.head = nn.ModuleList(HeadLayer(w, f"head.layers.{j}.", plan.attention) for j in range(cfg.head_layers))
        self.type_emb = _param(w["type_emb.weight"])
        self.scorer = nn.ParameterList(_param(w[f"scorer.{n}"]) for n in
                                       ("0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"))
        self.act = nn.ParameterList(_param(w[f"act_head.{n}"]) for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
        assert self.act[0].shape[0] == ACT_HIDDEN

    def forward(self, emb: torch.Tensor, keep: torch.Tensor | None, marker_pos: torch.Tensor,
                marker_mask: torch.Tensor, qtype: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Option logits [B, K] (MASKED_LOGIT where `marker_mask` is false) and act logits [B, n_act]
        from embeddings [B, L, d] (fp32); `keep` [B, L] marks real tokens, None when no row is padded."""
        x = self.encode(emb, keep)
        h = x + self.type_emb[qtype][:, None, :]
        return self.decide(h, keep, marker_pos, marker_mask)

    def encode(self, emb: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        b, n, d = emb.shape
        x = F.layer_norm(emb, (d,), self.emb_norm, None, self.eps)
        pos = torch.arange(n, device=emb.device)
        local_mask = ((pos[:, None] - pos[None, :]).abs() <= self.half_window)[None, None]  # [1, 1, L, L]
        global_mask = None
        if keep is not None:  # padded rows: key masks, and padded queries see every valid key (no empty row)
            global_mask = keep[:, None, None, :]
            local_mask = (local_mask | ~keep[:, None, :, None]) & global_mask
        for i, layer in enumerate(self.layers):
            is_global = self.globals[i]
            cos = (self.global_cos if is_global else self.local_cos)[:n]
            sin = (self.global_sin if is_global else self.local_sin)[:n]
            h = x if layer.attn_norm is None else F.layer_norm(x, (d,), layer.attn_norm, None, self.eps)
            qkv = layer.wqkv(h).view(b, n, 3, self.heads, self.head_dim)
            q, k, v = qkv.unbind(2)
            dtype = torch.float32 if i < self.plan.fp32_layers else DTYPES[self.plan.attention]
            q, k, v = (t.to(dtype).transpose(1, 2) for t in (_rotate(q, cos, sin), _rotate(k, cos, sin), v))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=global_mask if is_global else local_mask)
            x = x + layer.wo(a.transpose(1, 2).reshape(b, n, d))
            up = layer.wi(F.layer_norm(x, (d,), layer.mlp_norm, None, self.eps))
            gate, value = up.chunk(2, -1)
            x = x + layer.wo_mlp(F.gelu(gate) * value)
        return F.layer_norm(x, (d,), self.final_norm, None, self.eps)

    def decide(self, h: torch.Tensor, keep: torch.Tensor | None, marker_pos: torch.Tensor,
               marker_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, d = h.shape
        heads = max(1, d // 64)
        read = torch.cat([torch.zeros_like(marker_pos[:, :1]), marker_pos], 1)  # CLS, then the markers
        mask = None if keep is None else keep[:, None, None, :]
        for j, layer in enumerate(self.head):
            last = j == len(self.head) - 1
            y = F.layer_norm(h, (d,), layer.n1w, layer.n1b, HEAD_EPS)
            qkv = layer.qkv(y)
            q, k, v = qkv.chunk(3, -1)
            if last:  # only CLS and the markers are read after this layer
                h = torch.gather(h, 1, read[:, :, None].expand(-1, -1, d))
                q = torch.gather(q, 1, read[:, :, None].expand(-1, -1, d))
            m = q.shape[1]
            dtype = DTYPES[self.plan.attention]
            q = q.to(dtype).view(b, m, heads, d // heads).transpose(1, 2)
            k, v = (t.to(dtype).view(b, n, heads, d // heads).transpose(1, 2) for t in (k, v))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, m, d)
            h = h + layer.out(a)
            y = F.layer_norm(h, (d,), layer.n2w, layer.n2b, HEAD_EPS)
            h = h + layer.down(F.relu(layer.up(y)))
        if not self.head:
            h = torch.gather(h, 1, read[:, :, None].expand(-1, -1, d))
        return self.score(h[:, 1:], h[:, 0], marker_mask)

    def score(self, m: torch.Tensor, cls: torch.Tensor, marker_mask: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Option logits of the marker vectors [B, K, d] and the act head on the CLS vector [B, d]."""
        s = self.scorer
        y = F.linear(F.layer_norm(m, (m.shape[-1],), s[0], s[1], HEAD_EPS), s[2], s[3])
        logits = F.linear(F.gelu(y), s[4], s[5]).squeeze(-1).masked_fill(~marker_mask, MASKED_LOGIT)
        # one empty slot more (probability 0): a single option's runner-up, with no branch on the shape
        p = torch.softmax(F.pad(logits, (0, 1), value=MASKED_LOGIT), -1)
        k = marker_mask.sum(-1).clamp(min=2).float()
        entropy = -(p * torch.log(p.clamp_min(1e-9))).sum(-1) / torch.log(k)
        top = p.topk(2, -1).values
        feats = torch.stack([top[:, 0], top[:, 0] - top[:, 1], entropy, k / 255.0], -1)
        a = self.act
        act = F.linear(F.gelu(F.linear(torch.cat([cls, feats], -1), a[0], a[1])), a[2], a[3])
        return logits, act


def attention_flops(n: int, d: int) -> float:
    """FLOPs of one layer's attention products (QK^T and PV) over a row of `n` tokens, as computed
    (a local layer's band is computed as a masked full product)."""
    return 4.0 * n * n * d


def matmul_flops(checkpoint: Checkpoint, n: int, markers: int = 4) -> float:
    """FLOPs of every matrix product of one row of `n` tokens as this network runs it (the projections,
    attention's two products, the head with its last layer read at CLS and the markers): what the
    benchmark divides by to give the matrix floor."""
    enc, cfg = checkpoint.encoder, checkpoint.config
    d, inner = enc.hidden_size, enc.intermediate_size
    layer = 2.0 * n * d * (3 * d + d + 2 * inner) + 2.0 * n * inner * d + attention_flops(n, d)
    total = enc.num_hidden_layers * layer
    read = markers + 1
    for j in range(cfg.head_layers):
        rows = read if j == cfg.head_layers - 1 else n
        total += 2.0 * n * d * 2 * d + 2.0 * rows * d * (d + d + 8 * d) + 4.0 * rows * n * d
    return total + 2.0 * read * d * d

