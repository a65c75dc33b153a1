"""The decision network in plain torch: one module for the fast runtimes and the exporters.

The reference runtime (`pytorch.py`) runs transformers' ModernBERT over a padded batch in fp32 and is
left alone as the anchor every other runtime is held to. Every other torch network is this one
(laya-format.md sections 3 and 6), in one of two configurations that differ only in a few operations:

- `RowNet` (the packed and cuda runtimes) runs rows the way a fast runtime wants them. A batch of one
  row at its exact length needs no padding mask: global layers attend without any mask, local ones
  with the band alone (the fused attention kernels run a masked full product faster than blocked
  windows up to about 600 tokens here). With several padded rows (a GPU's buckets), key masks come
  back and padded queries see every valid key, as in the reference. The matrix products run in the
  plan's precision (`Plan`): bf16 or fp16 on matrix units, fp32 for the exact path; the residual
  stream, every LayerNorm, RoPE, the scorer and the act head stay fp32, and the plan may keep the first
  encoder layers wholly fp32 (rounding there is carried through all the later ones).
- `laya.encoder.export.torch_net.PortableNet` (the ONNX and Core ML exports) swaps in the exporters'
  operations: additive masks, attention, RoPE and GeGLU's GELU as replaceable (fusable) calls, fp32
  products with their bias fused as nn.Linear has it, and the head's norms pre-scaled for fp16.

`Network` takes embeddings already gathered (the table stays outside the graph a compiler sees; only
PortableNet gathers in its graph), so RowNet runs eagerly, ahead-of-time compiled (`compiled.py`), and
on a GPU. `rope_tables`, `rotate` and `act_features` are the one torch copy of those pieces of the
maths (the reference's act features and the Neural Engine network's tables are these).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed, int8's graph form
import torch.nn.functional as F
from torch import nn

from laya.encoder.checkpoint import Checkpoint
from laya.encoder.gate import GateFailed, describe
from laya.encoder.head_layout import ACT_HIDDEN, MASKED_LOGIT

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16", "int8")
HEAD_EPS = 1e-5
EMBEDDINGS = "encoder.embeddings.tok_embeddings.weight"  # gathered from as stored (fp16 in a checkpoint)
Masks = dict[str, Any]  # "global", "local" (the encoder's) and "head": each in its `attend`'s form, or None


@dataclass(frozen=True)
class Plan:
    """What runs in which precision: the encoder's projections in `matmul` (fp32, bf16, fp16, or int8 in
    two levels: see `Projection`), attention and the
    decision head's projections in `attention` (a float type), except the first `fp32_layers` encoder
    layers, which run wholly in fp32."""

    matmul: str = "fp32"
    attention: str = "fp32"
    fp32_layers: int = 0

    @property
    def label(self) -> str:
        """The precision a user names: the encoder's projections, where the arithmetic is."""
        return self.matmul

    @property
    def key(self) -> str:
        """The plan in a cache key (gate records, compiled programs)."""
        return f"{self.matmul}-{self.attention}-l{self.fp32_layers}"

    def describe(self) -> str:
        if self.matmul == self.attention == "fp32":
            return "fp32"
        matmul = "int8 (two-level)" if self.matmul == "int8" else self.matmul
        text = f"{matmul} projections, {self.attention} attention and head"
        if self.fp32_layers:
            text += f", the first {self.fp32_layers} encoder layer{'s' if self.fp32_layers > 1 else ''} in fp32"
        return text


def tried_plans(precision: str, attention: str, fp32_layer_tiers: tuple[int, ...]) -> list[Plan]:
    """The plans a precision's gate tries, in order: fp32 needs none; a reduced precision keeps ever more
    of the first encoder layers in fp32, where rounding is carried through every later layer."""
    if precision == "fp32":
        return [Plan()]
    return [Plan(precision, attention, kept) for kept in fp32_layer_tiers]


def first_passing_plan(runtime: str, precision: str, checkpoint: Checkpoint, tried: list[Plan],
                       gate: Callable[[Plan], dict[str, Any]], force: bool) -> tuple[Plan, dict[str, Any] | None]:
    """The plan a reduced precision runs (packed, cuda) and its gate record: the first of `tried` whose
    record passes (fp32 needs none); forced past a failed gate, the last tried (the most accurate), with
    the record the refusal names."""
    if precision == "fp32":
        return tried[0], None
    records = []
    for plan in tried:
        records.append(gate(plan))
        if records[-1]["passed"]:
            return plan, records[-1]
    if not force:
        raise GateFailed(f"{runtime} {precision} failed its accuracy gate on {checkpoint.path} "
                         f"({describe(records[-1])}, with {tried[-1].describe()}): its answers drift from fp32 "
                         "beyond the precision standard. Use precision='fp32', or pass force=True to accept "
                         "it", records[-1])
    return tried[-1], records[-1]


def _param(array, dtype: torch.dtype = torch.float32) -> nn.Parameter:
    return nn.Parameter(torch.as_tensor(array).to(dtype).contiguous(), requires_grad=False)


class Projection(nn.Module):
    """x @ W^T (+ b) in one precision, handed back as fp32 (the bias is fp32, added after the product).

    int8 runs in two levels, so that the int8 units give nearly fp32's answers: a tensor t is its
    rounding to 127 levels of its largest magnitude, hi, plus what that leaves, lo, rounded to 127 levels
    of half a step (about 15 bits in all). The weight is split once per output channel, the activation
    per row as it comes (one scale per row: the int8 kernels take one), and the product is the three
    int8 products that matter, hi·hi + lo·hi + hi·lo, each written in fp32 (lo·lo is below the rounding).
    One level alone moved a full-size checkpoint's answers by 0.126 (its gate refused it); two levels move
    them about as little as fp32 projections with bf16 attention do (0.015 against 0.014). Written as
    dequantised tensors feeding fp32 products, the form TorchInductor's x86 lowering turns into oneDNN's
    int8 products with an fp32 output (AMX-INT8, VNNI); run eagerly, the same numbers through fp32 products."""

    def __init__(self, weight, bias, kind: str):
        super().__init__()
        self.kind = kind
        w = torch.as_tensor(weight).float()
        if kind == "int8":
            (hi, hi_step), (lo, lo_step) = int8_levels(w, 1)
            # the activation's hi level meets both weight levels in one product ([hi; lo] stacked on the
            # outputs), its lo level the weight's hi level in another: a rounded activation that fed two
            # products was left unlowered (every weight dequantised on every call, 8x slower than bf16)
            self.weight = _param(torch.cat([hi, lo]), torch.int8)
            self.scale = _param(torch.cat([hi_step, lo_step]).flatten())
            self.weight_hi, self.scale_hi = _param(hi, torch.int8), _param(hi_step.flatten())
            self.register_buffer("zero", torch.zeros(2 * w.shape[0], dtype=torch.int64), persistent=False)
            self.register_buffer("zero_hi", torch.zeros(w.shape[0], dtype=torch.int64), persistent=False)
        else:
            self.weight = nn.Parameter(w.to(DTYPES[kind]).contiguous(), requires_grad=False)
        self.bias = None if bias is None else _param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._int8(x.float()) if self.kind == "int8" else F.linear(x.to(self.weight.dtype), self.weight).float()
        return y if self.bias is None else y + self.bias

    def _int8(self, x: torch.Tensor) -> torch.Tensor:
        qd, n = torch.ops.quantized_decomposed, self.weight_hi.shape[0]
        both = qd.dequantize_per_channel(self.weight, self.scale, self.zero, 0, -128, 127, torch.int8)
        w_hi = qd.dequantize_per_channel(self.weight_hi, self.scale_hi, self.zero_hi, 0, -128, 127, torch.int8)
        step = x.abs().amax().clamp_min(1e-12) / 127.0
        hi = _rounded(x, step)
        out = F.linear(hi, both)
        return out[..., :n] + out[..., n:] + F.linear(_rounded(x - hi, step / LO_LEVELS), w_hi)


LO_LEVELS = 254.0  # the second level's step is the first's / 254: its residual (at most half a step) fills int8


Level = tuple[torch.Tensor, torch.Tensor]  # int8 values and their step


def int8_levels(t: torch.Tensor, dim: int) -> tuple[Level, Level]:
    """`t` (fp32) as two int8 levels along `dim`: (hi, its step), (lo, its step), with t ~ hi*step + lo*step_lo."""
    step = t.abs().amax(dim, keepdim=True).clamp_min(1e-12) / 127.0
    hi = torch.round(t / step).clamp(-127, 127)
    lo = torch.round((t - hi * step) / (step / LO_LEVELS)).clamp(-127, 127)
    return (hi.to(torch.int8), step), (lo.to(torch.int8), step / LO_LEVELS)


def _rounded(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """`x` rounded to int8 levels of `step` (a 0-d tensor) and back, as the int8 kernels' input."""
    qd, zero = torch.ops.quantized_decomposed, torch.zeros((), dtype=torch.int64)
    return qd.dequantize_per_tensor.tensor(qd.quantize_per_tensor.tensor(x, step, zero, -128, 127, torch.int8),
                                           step, zero, -128, 127, torch.int8)


class Linear(nn.Module):
    """x @ W^T + b in fp32 as one call, the bias fused into the product as nn.Linear has it: the
    exporters' projection (`kind` is always fp32 there)."""

    def __init__(self, weight, bias, kind: str = "fp32"):
        super().__init__()
        self.weight = _param(weight)
        self.bias = None if bias is None else _param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


Project = Callable[[Any, Any, str], nn.Module]  # (weight, bias or None, precision) -> a projection


def rope_tables(theta: float, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE's cos and sin [length, head_dim] for positions 0..length-1, computed once in fp32:
    an fp16 program that computed position x frequency itself would lose ~0.1 rad of angle at 256."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dim: int = -1, half: int | None = None
           ) -> torch.Tensor:
    """Rotate-half RoPE of `x` along `dim` (a head's channels) by tables that broadcast against it. `half`
    (half the channels) is given where a tracer would record reading the shape as graph operations
    (torch.jit.trace, the Neural Engine network's converter)."""
    half = x.shape[dim] // 2 if half is None else half
    before = (slice(None),) * (dim % x.dim())
    return x * cos + torch.cat([-x[before + (slice(half, None),)], x[before + (slice(None, half),)]], dim) * sin


def act_features(logits: torch.Tensor, k: torch.Tensor | None = None) -> torch.Tensor:
    """[top1, top1 - top2, normalised entropy, k / 255] of untempered option distributions: `logits`
    [..., K] with MASKED_LOGIT past each row's real options, K >= 2 (a single option's runner-up is an
    empty slot), and `k` their count, at least 2, in fp32. `k=None`: one row whose every slot is an
    option, padded here when it has one (the reference and training call it so; the graphs give `k`
    and two slots or more, as a branch on a traced shape would specialise them)."""
    p = torch.softmax(logits, -1)
    if k is None:
        k = torch.tensor(float(max(2, p.shape[-1])), device=p.device)
        if p.shape[-1] < 2:
            p = F.pad(p, (0, 1))
    entropy = -(p * torch.log(p.clamp_min(1e-9))).sum(-1) / torch.log(k)
    top = p.topk(2, -1).values
    return torch.stack([top[..., 0], top[..., 0] - top[..., 1], entropy, k / 255.0], -1)


class EncoderLayer(nn.Module):
    """One ModernBERT layer's tensors under the checkpoint's names (layer 0's attention norm is the identity)."""

    def __init__(self, weights, i: int, kind: str, project: Project):
        super().__init__()
        p = f"encoder.layers.{i}."
        self.attn_norm = _param(weights[p + "attn_norm.weight"]) if i else None
        self.Wqkv = project(weights[p + "attn.Wqkv.weight"], None, kind)
        self.Wo = project(weights[p + "attn.Wo.weight"], None, kind)
        self.mlp_norm = _param(weights[p + "mlp_norm.weight"])
        self.Wi = project(weights[p + "mlp.Wi.weight"], None, kind)
        self.Wo_mlp = project(weights[p + "mlp.Wo.weight"], None, kind)


class HeadLayer(nn.Module):
    """One layer of the decision head (a pre-norm nn.TransformerEncoderLayer with ReLU, width 4d)."""

    def __init__(self, weights, prefix: str, kind: str, project: Project):
        super().__init__()
        for ours, theirs in (("qkv", "self_attn.in_proj"), ("out", "self_attn.out_proj"), ("up", "linear1"),
                             ("down", "linear2")):
            joint = "_" if theirs.endswith("in_proj") else "."
            setattr(self, ours, project(weights[prefix + theirs + joint + "weight"],
                                        weights[prefix + theirs + joint + "bias"], kind))
        for ours, theirs in (("n1w", "norm1.weight"), ("n1b", "norm1.bias"), ("n2w", "norm2.weight"),
                             ("n2b", "norm2.bias")):
            setattr(self, ours, _param(weights[prefix + theirs]))


class Network(nn.Module):
    """Encoder (from gathered embeddings), decision head, scorer and act head of a checkpoint.

    The layers' arithmetic is written once, here; what its users do differently are the operations a
    subclass replaces: `masks` and `attend` (boolean masks and SDPA, or additive ones and a fusable
    call), `rope`, `gelu` (GeGLU's), the projections (`project`), and two switches: `spare_slot` (pad
    the option logits with one empty slot before the act features, so a single option needs no branch
    on the shape) and `head_norm_scale` (the head's LayerNorms divide their input first, for fp16
    programs). The last head layer is read only where it is used: its queries, attention output and
    feed-forward at the CLS position and the option markers, its keys and values over the whole row (on
    the mmBERT-base shape the two head layers hold about 2.8 encoder layers' products; narrowing the last
    made a 6-layer student's 128-token answer about 14% faster)."""

    spare_slot = True
    head_norm_scale = 1.0

    def __init__(self, checkpoint: Checkpoint, plan: Plan = Plan(), project: Project = Projection):
        super().__init__()
        w, enc, cfg = checkpoint.weights, checkpoint.encoder, checkpoint.config
        self.plan, self.enc = plan, enc
        self.d, self.heads, self.head_dim = enc.hidden_size, enc.num_attention_heads, enc.head_dim
        self.eps, self.half_window = enc.norm_eps, enc.local_attention // 2
        self.emb_norm = _param(w["encoder.embeddings.norm.weight"])
        self.final_norm = _param(w["encoder.final_norm.weight"])
        n_layers = enc.num_hidden_layers
        self.layers = nn.ModuleList(EncoderLayer(w, i, "fp32" if i < plan.fp32_layers else plan.matmul, project)
                                    for i in range(n_layers))
        self.globals = [enc.is_global(i) for i in range(n_layers)]
        self.dtypes = [torch.float32 if i < plan.fp32_layers else DTYPES[plan.attention] for i in range(n_layers)]
        for name, theta in (("global", enc.global_rope_theta), ("local", enc.local_rope_theta)):
            cos, sin = rope_tables(theta, self.head_dim, cfg.max_len)  # [L, 1, hd]: broadcast over heads
            self.register_buffer(f"{name}_cos", cos[:, None, :], persistent=False)
            self.register_buffer(f"{name}_sin", sin[:, None, :], persistent=False)
        self.head = nn.ModuleList(HeadLayer(w, f"head.layers.{j}.", plan.attention, project)
                                  for j in range(cfg.head_layers))
        self.type_emb = _param(w["type_emb.weight"])
        self.scorer = nn.ParameterList(_param(w[f"scorer.{n}"]) for n in
                                       ("0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"))
        self.act = nn.ParameterList(_param(w[f"act_head.{n}"]) for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
        assert self.act[0].shape[0] == ACT_HIDDEN

    # the replaceable operations
    def masks(self, keep: torch.Tensor | None, n: int) -> Masks:
        """Boolean masks: none where no row is padded (`keep=None`), the band alone for local layers;
        with padded rows, key masks, and padded queries see every valid key (no empty row)."""
        pos = torch.arange(n, device=self.final_norm.device)
        local = ((pos[:, None] - pos[None, :]).abs() <= self.half_window)[None, None]  # [1, 1, L, L]
        if keep is None:
            return {"global": None, "local": local, "head": None}
        keys = keep[:, None, None, :]
        return {"global": keys, "local": (local | ~keep[:, None, :, None]) & keys, "head": keys}

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, heads: int,
               dtype: torch.dtype) -> torch.Tensor:
        """Softmax attention over [B, Lq, D] queries and [B, L, D] keys and values, in `dtype`."""
        b, m, d = q.shape
        q = q.to(dtype).view(b, m, heads, d // heads).transpose(1, 2)
        k, v = (t.to(dtype).view(b, t.shape[1], heads, d // heads).transpose(1, 2) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, m, d)

    def rope(self, x: torch.Tensor, is_global: bool) -> torch.Tensor:
        """RoPE on [B, L, D] projections (heads inside) from the full-width tables."""
        b, n, d = x.shape
        cos = (self.global_cos if is_global else self.local_cos)[:n]
        sin = (self.global_sin if is_global else self.local_sin)[:n]
        return rotate(x.view(b, n, self.heads, self.head_dim), cos, sin).reshape(b, n, d)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    # the maths, once
    def forward(self, emb: torch.Tensor, keep: torch.Tensor | None, marker_pos: torch.Tensor,
                marker_mask: torch.Tensor | None, qtype: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Option logits [B, K] (MASKED_LOGIT where `marker_mask` is false; None: every slot an option)
        and act logits [B, n_act] from embeddings [B, L, d] (fp32); `keep` [B, L] marks real tokens."""
        masks = self.masks(keep, emb.shape[1])
        x = self.encode(emb, masks)
        h = x + F.embedding(qtype, self.type_emb)[:, None, :]
        return self.decide(h, masks["head"], marker_pos, marker_mask)

    def encode(self, emb: torch.Tensor, masks: Masks) -> torch.Tensor:
        d = emb.shape[-1]
        x = F.layer_norm(emb, (d,), self.emb_norm, None, self.eps)
        for i, layer in enumerate(self.layers):
            is_global = self.globals[i]
            h = x if layer.attn_norm is None else F.layer_norm(x, (d,), layer.attn_norm, None, self.eps)
            q, k, v = layer.Wqkv(h).chunk(3, -1)
            a = self.attend(self.rope(q, is_global), self.rope(k, is_global), v,
                            masks["global" if is_global else "local"], self.heads, self.dtypes[i])
            x = x + layer.Wo(a)
            gate, value = layer.Wi(F.layer_norm(x, (d,), layer.mlp_norm, None, self.eps)).chunk(2, -1)
            x = x + layer.Wo_mlp(self.gelu(gate) * value)
        return F.layer_norm(x, (d,), self.final_norm, None, self.eps)

    def head_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The head's and scorer's LayerNorm, its input divided by `head_norm_scale` first (LayerNorm is
        scale-invariant; eps is scaled to match)."""
        s = self.head_norm_scale
        if s == 1.0:
            return F.layer_norm(x, (x.shape[-1],), weight, bias, HEAD_EPS)
        return F.layer_norm(x * s, (x.shape[-1],), weight, bias, HEAD_EPS * s * s)

    def decide(self, h: torch.Tensor, mask, marker_pos: torch.Tensor,
               marker_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        d = h.shape[-1]
        heads, dtype = max(1, d // 64), DTYPES[self.plan.attention]
        read = torch.cat([torch.zeros_like(marker_pos[:, :1]), marker_pos], 1)[:, :, None].expand(-1, -1, d)
        if not len(self.head):  # CLS, then the markers: all that is read after the last head layer
            h = torch.gather(h, 1, read)
        for j, layer in enumerate(self.head):
            q, k, v = layer.qkv(self.head_norm(h, layer.n1w, layer.n1b)).chunk(3, -1)
            if j == len(self.head) - 1:
                h, q = torch.gather(h, 1, read), torch.gather(q, 1, read)
            h = h + layer.out(self.attend(q, k, v, mask, heads, dtype))
            h = h + layer.down(F.relu(layer.up(self.head_norm(h, layer.n2w, layer.n2b))))
        return self.score(h[:, 1:], h[:, 0], marker_mask)

    def score(self, m: torch.Tensor, cls: torch.Tensor, marker_mask: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Option logits of the marker vectors [B, K, d] and the act head on the CLS vector [B, d]."""
        s = self.scorer
        y = F.linear(self.head_norm(m, s[0], s[1]), s[2], s[3])
        logits = F.linear(F.gelu(y), s[4], s[5]).squeeze(-1)
        if marker_mask is None:  # every slot an option, and callers give at least two
            k = torch.ones_like(logits).sum(-1)
        else:
            logits, k = logits.masked_fill(~marker_mask, MASKED_LOGIT), marker_mask.sum(-1).clamp(min=2).float()
        slots = F.pad(logits, (0, 1), value=MASKED_LOGIT) if self.spare_slot else logits
        feats = act_features(slots, k)
        a = self.act
        act = F.linear(F.gelu(F.linear(torch.cat([cls, feats], -1), a[0], a[1])), a[2], a[3])
        return logits, act


class RowNet(Network):
    """The fast runtimes' configuration (packed, cuda): boolean masks and SDPA, projections in the
    plan's precisions, the last head layer read at CLS and the markers. See the module's docstring."""
