"""The tensors of a laya checkpoint, by name and shape, derived from its two configs.

One place knows the names, so the strict loader, every runtime's weight mapping and the test
checkpoint generator cannot disagree about them.
"""

from __future__ import annotations

from laya.encoder.config import AgentConfig, EncoderConfig

ACT_HIDDEN = 256
# The option logit every runtime returns for a marker slot that holds no option (runtimes/base.py).
MASKED_LOGIT = -1e4
ACT_FEATURES = 4
# why an answer's x_act_probability is null: the model was read from a file without an act head
NO_ACT_HEAD = "this model has no act head (read from a GGUF in llama.cpp's laya format, which carries none)"


def encoder_tensors(enc: EncoderConfig) -> dict[str, tuple[int, ...]]:
    d, i = enc.hidden_size, enc.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.tok_embeddings.weight": (enc.vocab_size, d),
        "embeddings.norm.weight": (d,),
    }
    for layer in range(enc.num_hidden_layers):
        p = f"layers.{layer}."
        if layer > 0:  # layer 0's attention norm is the identity
            shapes[p + "attn_norm.weight"] = (d,)
        shapes[p + "attn.Wqkv.weight"] = (3 * d, d)
        shapes[p + "attn.Wo.weight"] = (d, d)
        shapes[p + "mlp_norm.weight"] = (d,)
        shapes[p + "mlp.Wi.weight"] = (2 * i, d)
        shapes[p + "mlp.Wo.weight"] = (d, i)
    shapes["final_norm.weight"] = (d,)
    return shapes


def head_tensors(cfg: AgentConfig, d: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"type_emb.weight": (3, d)}
    for layer in range(cfg.head_layers):
        p = f"head.layers.{layer}."
        shapes[p + "self_attn.in_proj_weight"] = (3 * d, d)
        shapes[p + "self_attn.in_proj_bias"] = (3 * d,)
        shapes[p + "self_attn.out_proj.weight"] = (d, d)
        shapes[p + "self_attn.out_proj.bias"] = (d,)
        shapes[p + "linear1.weight"] = (4 * d, d)
        shapes[p + "linear1.bias"] = (4 * d,)
        shapes[p + "linear2.weight"] = (d, 4 * d)
        shapes[p + "linear2.bias"] = (d,)
        for norm in ("norm1", "norm2"):
            shapes[p + norm + ".weight"] = (d,)
            shapes[p + norm + ".bias"] = (d,)
    shapes.update({
        "scorer.0.weight": (d,),
        "scorer.0.bias": (d,),
        "scorer.1.weight": (d, d),
        "scorer.1.bias": (d,),
        "scorer.3.weight": (1, d),
        "scorer.3.bias": (1,),
        "act_head.0.weight": (ACT_HIDDEN, d + ACT_FEATURES),
        "act_head.0.bias": (ACT_HIDDEN,),
        "act_head.2.weight": (cfg.n_act, ACT_HIDDEN),
        "act_head.2.bias": (cfg.n_act,),
        "temperature": (3,),
    })
    return shapes


def checkpoint_tensors(cfg: AgentConfig, enc: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of `model.safetensors`, encoder ones under `encoder.`."""
    shapes = {"encoder." + k: v for k, v in encoder_tensors(enc).items()}
    shapes.update(head_tensors(cfg, enc.hidden_size))
    return shapes
