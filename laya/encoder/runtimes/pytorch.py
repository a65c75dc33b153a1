"""The reference runtime: transformers' ModernBERT for the encoder, the head in plain PyTorch, fp32.

Every other runtime is checked against this one. It follows laya-format.md section 6 literally
and favours clarity over speed; the fast CPU path is `runtime="packed"` (`packed.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from laya.encoder.batch import Batch
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.config import EncoderConfig
from laya.encoder.head_layout import ACT_HIDDEN, MASKED_LOGIT
from laya.encoder.runtimes.base import RuntimeBase
from laya.encoder.runtimes.rownet import act_features
from laya.errors import RuntimeUnavailable


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


class TorchRuntime(RuntimeBase):
    """`runtime="torch"`: fp32 on the CPU, deterministic, the reference every other runtime is held to."""

    name = "torch"
    precision = "fp32"
    gate = None  # the reference is not gated: the others are gated against it

    def __init__(self, checkpoint: Checkpoint, threads: int | None = None, precision: str = "fp32"):
        if precision != "fp32":
            raise RuntimeUnavailable(f"the torch runtime is the fp32 reference; for {precision!r} use "
                                     f"runtime='packed' (precision='{precision}'), or runtime='auto'")
        if threads:
            torch.set_num_threads(int(threads))
        tok, cfg, enc = checkpoint.tokenizer, checkpoint.config, checkpoint.encoder
        encoder = build_encoder(enc, tok.pad_id, tok.cls_id, tok.sep_id, cfg.max_len)
        net = DecisionNet(encoder, enc.hidden_size, cfg.head_layers, cfg.n_act)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in checkpoint.weights.items()}, strict=True)
        self.net = net.eval()

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


def reference_net(runtime: Any, checkpoint: Checkpoint) -> DecisionNet:
    """The reference network of `checkpoint`: `runtime`'s own where it is the torch runtime, else one
    loaded beside it (the layer lens and the shortlist's embedder read its hidden states)."""
    return runtime.net if isinstance(runtime, TorchRuntime) else TorchRuntime(checkpoint).net
