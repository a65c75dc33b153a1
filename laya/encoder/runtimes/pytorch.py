"""The reference runtime: transformers' ModernBERT for the encoder, the head in plain PyTorch, fp32.

Every other runtime is checked against this one. It follows laya-format.md section 6 literally
and favours clarity over speed.

`precision="bf16"` is the published checkpoints' own training precision and, on processors with
bf16 units, 2.6-3.8x the fp32 GEMM speed: the encoder's four projections per layer are bf16 GEMMs
(weights cast once, at load; fp32 accumulation, fp32 out), while attention itself, GeGLU's product,
the embeddings, every LayerNorm (and so the residual stream), the first encoder layer, the decision
head, the scorer and the act head stay fp32 (`BF16_PARTS_USED`). It is gated
against fp32 at load (`laya.gate`), the record cached per checkpoint, processor and torch version.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from laya.config import EncoderConfig
from laya.encoder.batch import Batch
from laya.encoder.checkpoint import Checkpoint
from laya.errors import RuntimeUnavailable
from laya.hardware import cpu
from laya.heads.layout import ACT_HIDDEN, MASKED_LOGIT


def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4.x
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def build_encoder(enc: EncoderConfig, pad_id: int, cls_id: int, sep_id: int, max_len: int) -> nn.Module:
    """An uninitialised transformers ModernBertModel with both RoPE thetas set explicitly."""
    from transformers import AutoModel, ModernBertConfig

    kwargs: dict[str, Any] = dict(
        vocab_size=enc.vocab_size,
        hidden_size=enc.hidden_size,
        intermediate_size=enc.intermediate_size,
        num_hidden_layers=enc.num_hidden_layers,
        num_attention_heads=enc.num_attention_heads,
        norm_eps=enc.norm_eps,
        norm_bias=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_activation="gelu",
        global_rope_theta=enc.global_rope_theta,
        local_rope_theta=enc.local_rope_theta,
        local_attention=enc.local_attention,
        global_attn_every_n_layers=enc.global_attn_every_n_layers,
        max_position_embeddings=max(8192, max_len),
        pad_token_id=pad_id,
        cls_token_id=cls_id,
        sep_token_id=sep_id,
        bos_token_id=cls_id,
        eos_token_id=sep_id,
        attention_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
    )
    kwargs["layer_types"] = [
        "full_attention" if enc.is_global(i) else "sliding_attention" for i in range(enc.num_hidden_layers)
    ]
    config = ModernBertConfig(**kwargs)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "full_attention" in rope:  # transformers 5
        rope["full_attention"]["rope_theta"] = enc.global_rope_theta
        rope["sliding_attention"]["rope_theta"] = enc.local_rope_theta
    else:  # transformers 4.x
        config.global_rope_theta = enc.global_rope_theta
        config.local_rope_theta = enc.local_rope_theta
    with _no_init():
        return AutoModel.from_config(config, attn_implementation="sdpa")


class HeadAttention(nn.Module):
    """Packed-projection multi-head attention with the parameter names of nn.MultiheadAttention."""

    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * d))
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class HeadLayer(nn.Module):
    """Pre-norm transformer layer: attention, then a ReLU feed-forward of width 4d."""

    def __init__(self, d: int):
        super().__init__()
        self.self_attn = HeadAttention(d, max(1, d // 64))
        self.linear1 = nn.Linear(d, 4 * d)
        self.linear2 = nn.Linear(4 * d, d)
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)

    def forward(self, h: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(self.norm1(h), keep)
        return h + self.linear2(F.relu(self.linear1(self.norm2(h))))


class Head(nn.Module):
    def __init__(self, d: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(HeadLayer(d) for _ in range(n_layers))


class DecisionNet(nn.Module):
    """Encoder + decision head + act head, with the checkpoint's exact tensor names."""

    def __init__(self, encoder: nn.Module, d: int, head_layers: int, n_act: int):
        super().__init__()
        self.encoder = encoder
        self.head = Head(d, head_layers)
        self.type_emb = nn.Embedding(3, d)
        self.scorer = nn.Sequential(nn.LayerNorm(d, eps=1e-5), nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.act_head = nn.Sequential(nn.Linear(d + 4, ACT_HIDDEN), nn.GELU(), nn.Linear(ACT_HIDDEN, n_act))
        self.register_buffer("temperature", torch.ones(3))

    def forward(self, input_ids, attention_mask, marker_pos, marker_mask, qtype):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        with torch.autocast("cpu", enabled=False):  # the head, scorer and act head: fp32 in every precision
            return self.decide(h.float(), attention_mask, marker_pos, marker_mask, qtype)

    def decide(self, h, attention_mask, marker_pos, marker_mask, qtype):
        logits, act_inputs = self.read(h, attention_mask, marker_pos, marker_mask, qtype)
        return logits, torch.cat([self.act_head(x[None]) for x in act_inputs])

    def read(self, h, attention_mask, marker_pos, marker_mask, qtype):
        """Option logits [N, K] and the act head's inputs [N, d + 4] (training fits the act head on them).

        The scorer and act head see a handful of vectors per row. They run row by row on the row's real
        markers: a GEMM this small picks its kernel by the number of rows it is given, so a batched call
        would make a question's answer depend (in the last bits) on its batch company."""
        h = h + self.type_emb(qtype)[:, None, :]
        keep = attention_mask.bool()[:, None, None, :]
        for layer in self.head.layers:
            h = layer(h, keep)
        logits = torch.full(marker_mask.shape, MASKED_LOGIT, dtype=torch.float32, device=h.device)
        act_inputs = []
        for i, k in enumerate(marker_mask.sum(-1).tolist()):
            z = self.scorer(h[i, marker_pos[i, :k]]).squeeze(-1).float()
            logits[i, :k] = z
            act_inputs.append(torch.cat([h[i, 0].float(), act_features(z)]))
        return logits, torch.stack(act_inputs)


def act_features(z: torch.Tensor) -> torch.Tensor:
    """[top1, top1 - top2, normalised entropy, k / 255] of one row's untempered option distribution."""
    k = z.numel()
    p = torch.softmax(z, -1)
    kk = torch.tensor(float(max(2, k)), device=z.device)
    entropy = -(p * torch.log(p.clamp_min(1e-9))).sum() / torch.log(kk)
    top = p.topk(2).values if k >= 2 else torch.cat([p, torch.zeros_like(p)])
    return torch.stack([top[0], top[0] - top[1], entropy, kk / 255.0])


PRECISIONS = ("fp32", "bf16")
# Bumped whenever what runs in bf16 changes, so that cached gate records of the old split are not reused.
BF16_REVISION = 3
# Encoder layers kept in fp32: rounding in the first layer is carried through every later one. Measured on
# the golden checkpoints: max |dp| 0.0214 with every layer in bf16, 0.0126 with the first in fp32 (the last
# in fp32 instead: 0.0208); on the 22-layer mmBERT-base shape it is 1/22 of the encoder's work.
FP32_LAYERS = 1
# The parts of an encoder layer that can run in bf16 (benchmarks/precision_errors.py measures each alone):
# the query, key and value thirds of Wqkv, the attention output, GeGLU's Wi and Wo, attention itself
# (QK^T, softmax, PV) and GeGLU's product.
BF16_PARTS = ("wq", "wk", "wv", "attn_out", "attention", "wi", "geglu", "mlp_out")
# What the runtime runs in bf16: the projections but the query and key (together ~76% of an encoder
# layer's arithmetic), each a bf16 GEMM with fp32 accumulation read back as fp32. Queries, keys and
# attention stay fp32: with content-dependent attention the logits q.k are the sensitive quantity (an
# input or a weight rounded to bf16's 8 bits moves them, and the softmax's weights with them: Wqkv alone
# in bf16 moved answers by 0.023 on the adversarial checkpoint, the other projections 0.002-0.008 each).
# GeGLU's product and everything between the GEMMs (RoPE, residual adds, LayerNorms) stay fp32.
BF16_PARTS_USED = frozenset({"wv", "attn_out", "wi", "mlp_out"})


class Bf16Linear(nn.Module):
    """A projection whose weight is kept in bf16 (cast once) and whose input is rounded to bf16 for the
    GEMM; the product is accumulated in fp32 by the kernel and handed on as fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y + self.bias


class SplitQkv(nn.Module):
    """Wqkv with each of its query, key and value thirds in its own precision: one GEMM per precision,
    the outputs concatenated in Wqkv's order."""

    def __init__(self, linear: nn.Linear, bf16: tuple[bool, bool, bool]):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("SplitQkv expects Wqkv without a bias (ModernBERT's attention_bias=False)")
        thirds = linear.weight.detach().chunk(3, dim=0)
        self.bf16 = bf16
        self.groups = nn.ModuleList()
        for low in (False, True):  # consecutive thirds of one precision share a GEMM
            picked = [w for w, b in zip(thirds, bf16) if b == low]
            if picked:
                w = torch.cat(picked)
                self.groups.append(Bf16Linear(w) if low else _fp32_linear(w))
        self.order = sorted(range(3), key=lambda i: bf16[i])  # third i's place among the GEMMs' outputs

    @torch.autocast("cpu", enabled=False)  # the fp32 thirds stay fp32 inside bf16 attention too
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        out = torch.cat([g(x) for g in self.groups], dim=-1) if len(self.groups) > 1 else self.groups[0](x)
        if self.order == [0, 1, 2]:
            return out
        parts = out.chunk(3, dim=-1)
        return torch.cat([parts[self.order.index(i)] for i in range(3)], dim=-1)


def _fp32_linear(weight: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = nn.Parameter(weight.clone(), requires_grad=False)
    return linear


def _bf16_attention(attn: nn.Module) -> None:
    """Attention (QK^T, softmax, PV) in bf16: transformers' SDPA under autocast. The projections keep
    their own precision: an fp32 one runs with autocast off."""
    for name in ("Wqkv", "Wo"):
        linear = getattr(attn, name)
        if isinstance(linear, nn.Linear):
            fp32 = torch.autocast("cpu", enabled=False)(linear.forward)
            linear.forward = lambda x, fp32=fp32: fp32(x.float())
    attn.forward = torch.autocast("cpu", dtype=torch.bfloat16)(attn.forward)


def _bf16_geglu(mlp: nn.Module) -> None:
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        x, gate = mlp.Wi(hidden).chunk(2, dim=-1)
        return mlp.Wo((mlp.act(x.to(torch.bfloat16)) * gate.to(torch.bfloat16)).float())

    mlp.forward = forward


def cast_bf16(net: DecisionNet, parts: frozenset[str] | set[str] = BF16_PARTS_USED,
              layers: set[int] | None = None) -> DecisionNet:
    """Run `parts` of the encoder layers in bf16 (all but the first FP32_LAYERS, or `layers`); all else,
    the embeddings, LayerNorms, head, scorer and act head, stays fp32."""
    unknown = set(parts) - set(BF16_PARTS)
    if unknown:
        raise ValueError(f"unknown bf16 parts {sorted(unknown)}; known: {BF16_PARTS}")
    for i, layer in enumerate(net.encoder.layers):
        if (i not in layers) if layers is not None else i < FP32_LAYERS:
            continue
        qkv = tuple(part in parts for part in ("wq", "wk", "wv"))
        if all(qkv):
            layer.attn.Wqkv = Bf16Linear(layer.attn.Wqkv.weight, layer.attn.Wqkv.bias)
        elif any(qkv):
            layer.attn.Wqkv = SplitQkv(layer.attn.Wqkv, qkv)
        for part, owner, name in (("attn_out", layer.attn, "Wo"), ("wi", layer.mlp, "Wi"),
                                  ("mlp_out", layer.mlp, "Wo")):
            if part in parts:
                linear = getattr(owner, name)
                setattr(owner, name, Bf16Linear(linear.weight, linear.bias))
        if "attention" in parts:
            _bf16_attention(layer.attn)
        if "geglu" in parts:
            _bf16_geglu(layer.mlp)
    return net


class TorchRuntime:
    """`runtime="torch"`: fp32 on the CPU, deterministic; or bf16 where the processor has bf16 units."""

    name = "torch"

    def __init__(self, checkpoint: Checkpoint, threads: int | None = None, precision: str = "fp32",
                 force: bool = False):
        if precision not in PRECISIONS:
            raise RuntimeUnavailable(f"torch precision must be one of {PRECISIONS}, got {precision!r}")
        refusal = cpu().bf16_refusal() if precision == "bf16" else None
        if refusal and not force:
            raise RuntimeUnavailable(f"torch bf16 refused: {refusal}. Use precision='fp32' (or another "
                                     "runtime), or pass force=True to run it anyway")
        if threads:
            torch.set_num_threads(int(threads))
        tok, cfg, enc = checkpoint.tokenizer, checkpoint.config, checkpoint.encoder
        encoder = build_encoder(enc, tok.pad_id, tok.cls_id, tok.sep_id, cfg.max_len)
        net = DecisionNet(encoder, enc.hidden_size, cfg.head_layers, cfg.n_act)
        state = {k: torch.from_numpy(v) for k, v in checkpoint.weights.items()}
        net.load_state_dict(state, strict=True)
        self.net = net.eval()
        self.precision = precision
        self.gate: dict[str, Any] | None = None
        if precision == "bf16":
            self._to_bf16(checkpoint, force)

    def _to_bf16(self, checkpoint: Checkpoint, force: bool) -> None:
        from laya.gate import GateFailed, cached_gate, describe

        def measure() -> dict[str, Any]:
            from laya.gate import measure as run_gate

            reference = TorchRuntime.__new__(TorchRuntime)
            reference.net, reference.precision = self.net, "fp32"
            candidate = TorchRuntime.__new__(TorchRuntime)
            candidate.net, candidate.precision = cast_bf16(copy.deepcopy(self.net)), "bf16"
            return run_gate(checkpoint, reference.forward, candidate.forward, "bf16")

        key = f"torch-bf16-r{BF16_REVISION}-{checkpoint.fingerprint[:16]}-{cpu().key}-torch{torch.__version__}"
        self.gate = cached_gate(key, measure)
        self.net = cast_bf16(self.net)
        if not self.gate["passed"] and not force:
            raise GateFailed(f"torch bf16 failed its accuracy gate on {checkpoint.path} ({describe(self.gate)}): "
                             "its answers drift from fp32 beyond the documented bound. Use precision='fp32', "
                             "or pass force=True to accept it", self.gate)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        logits, act = self.net(
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            torch.from_numpy(batch.marker_pos),
            torch.from_numpy(batch.marker_mask),
            torch.from_numpy(batch.qtype),
        )
        return logits.numpy().astype(np.float32, copy=False), act.float().numpy()
