"""The decision head, scorer and act head in numpy fp32, for runtimes whose engine returns only the
encoder's token states (llama.cpp): the same maths as the reference's `DecisionNet.read`.

Each row runs alone over its real tokens. The reference masks padding out of the head's attention
keys, so leaving padding out is the same sum; and a row's answer then never depends on the batch it
came in (a GEMM picks its kernel by the number of rows it is given).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

EPS = 1e-5  # every LayerNorm of the head, scorer and act head (the reference's nn.LayerNorm eps)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float = EPS) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdims=True)
    out = centred / np.sqrt(var + np.float32(eps)) * weight
    return out + bias if bias is not None else out


def erfc(x: np.ndarray) -> np.ndarray:
    """The complementary error function in float64, to about 1.2e-7 relative everywhere: a
    Chebyshev-fitted exponential (Numerical Recipes' `erfcc` coefficients). numpy has no erf, and this
    is exact enough for an fp32 GELU."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    ans = t * np.exp(poly)
    return np.where(x >= 0, ans, 2.0 - ans)


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU, x * Phi(x), computed in float64 and returned in x's dtype."""
    x64 = x.astype(np.float64)
    return (0.5 * x64 * erfc(-x64 / math.sqrt(2.0))).astype(x.dtype)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class NumpyHead:
    """The checkpoint's head tensors (by their checkpoint names), applied to one row's token states."""

    def __init__(self, tensors: Mapping[str, np.ndarray], head_layers: int):
        t = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
        self.type_emb = t["type_emb.weight"]
        self.layers: list[dict[str, Any]] = []
        for i in range(head_layers):
            p = f"head.layers.{i}."
            self.layers.append({
                "norm1": (t[p + "norm1.weight"], t[p + "norm1.bias"]),
                "norm2": (t[p + "norm2.weight"], t[p + "norm2.bias"]),
                "in_w": np.ascontiguousarray(t[p + "self_attn.in_proj_weight"].T),
                "in_b": t[p + "self_attn.in_proj_bias"],
                "out_w": np.ascontiguousarray(t[p + "self_attn.out_proj.weight"].T),
                "out_b": t[p + "self_attn.out_proj.bias"],
                "l1_w": np.ascontiguousarray(t[p + "linear1.weight"].T), "l1_b": t[p + "linear1.bias"],
                "l2_w": np.ascontiguousarray(t[p + "linear2.weight"].T), "l2_b": t[p + "linear2.bias"],
            })
        self.scorer_norm = (t["scorer.0.weight"], t["scorer.0.bias"])
        self.scorer_w1, self.scorer_b1 = np.ascontiguousarray(t["scorer.1.weight"].T), t["scorer.1.bias"]
        self.scorer_w2, self.scorer_b2 = np.ascontiguousarray(t["scorer.3.weight"].T), t["scorer.3.bias"]
        self.act_w1, self.act_b1 = np.ascontiguousarray(t["act_head.0.weight"].T), t["act_head.0.bias"]
        self.act_w2, self.act_b2 = np.ascontiguousarray(t["act_head.2.weight"].T), t["act_head.2.bias"]
        d = self.type_emb.shape[1]
        self.n_heads = max(1, d // 64)

    def _attention(self, layer: dict, z: np.ndarray) -> np.ndarray:
        n, d = z.shape
        qkv = z @ layer["in_w"] + layer["in_b"]
        hd = d // self.n_heads
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(n, self.n_heads, hd).transpose(1, 0, 2) for j in range(3))
        weights = softmax(q @ k.transpose(0, 2, 1) * np.float32(1.0 / math.sqrt(hd)))
        out = (weights @ v).transpose(1, 0, 2).reshape(n, d)
        return out @ layer["out_w"] + layer["out_b"]

    def row(self, states: np.ndarray, markers: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
        """Option logits [k] and act logits [n_act] of one row: `states` [n, d] fp32 (its real tokens),
        `markers` the positions of its k options' [MASK]s."""
        h = states.astype(np.float32) + self.type_emb[qtype]
        for layer in self.layers:
            h = h + self._attention(layer, layer_norm(h, *layer["norm1"]))
            z = layer_norm(h, *layer["norm2"])
            h = h + np.maximum(z @ layer["l1_w"] + layer["l1_b"], 0) @ layer["l2_w"] + layer["l2_b"]
        m = layer_norm(h[markers], *self.scorer_norm)
        z = (gelu(m @ self.scorer_w1 + self.scorer_b1) @ self.scorer_w2 + self.scorer_b2)[:, 0]
        features = act_features(z)
        act = gelu(np.concatenate([h[0], features]) @ self.act_w1 + self.act_b1) @ self.act_w2 + self.act_b2
        return z.astype(np.float32), act.astype(np.float32)


def act_features(z: np.ndarray) -> np.ndarray:
    """[top1, top1 - top2, normalised entropy, k / 255] of one row's untempered option distribution."""
    k = z.shape[0]
    p = softmax(z.astype(np.float32))
    kk = np.float32(max(2, k))
    entropy = -(p * np.log(np.maximum(p, np.float32(1e-9)))).sum() / np.log(kk)
    top = np.sort(p)[::-1]
    second = top[1] if k >= 2 else np.float32(0.0)
    return np.array([top[0], top[0] - second, entropy, kk / np.float32(255.0)], dtype=np.float32)
