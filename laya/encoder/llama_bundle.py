"""The llama runtime's bundle as it is written: its file names, its revision, the encoder GGUF's header
and the fp32 head beside it; and the GGUF tensor names of a checkpoint's weights.

Two writers make this bundle: the exporter (`laya.encoder.export.gguf`, from a checkpoint) and the
unpacking of a laya GGUF (`laya.encoder.gguf_file`, from the file's own tensors). They share these
pieces from here, below both, so the reader of a GGUF does not import the exporters, which import it
to measure a file read back (`laya.encoder.export.laya_gguf`). The tensor names are shared the same way
by the writers of a laya GGUF (`laya.encoder.export.laya_gguf`) and its reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.checkpoint import Checkpoint

# Bumped whenever the written file changes, so that cached bundles from an older exporter are not reused.
GGUF_REVISION = 2
ENCODER_FILE = "encoder.gguf"
HEAD_FILE = "head.safetensors"
ARCH = "modern-bert"
ACT_TENSORS = ("act_head.0.weight", "act_head.0.bias", "act_head.2.weight", "act_head.2.bias")


def encoder_tensors(layers: int) -> list[tuple[str, str, bool]]:
    """(GGUF name, checkpoint name, whether Q8_0 holds it in a q8_0 file) of an encoder of `layers` layers,
    in the file's order: the feed-forward matrices of the later half of the layers (rounding early is
    carried through more layers)."""
    quantised_from = max(1, layers // 2)
    out = [("token_embd.weight", "encoder.embeddings.tok_embeddings.weight", False),
           ("token_embd_norm.weight", "encoder.embeddings.norm.weight", False)]
    for i in range(layers):
        p, b = f"encoder.layers.{i}.", f"blk.{i}."
        if i > 0:  # layer 0's attention norm is the identity: llama.cpp applies it only when present
            out.append((b + "attn_norm.weight", p + "attn_norm.weight", False))
        out += [(b + "attn_qkv.weight", p + "attn.Wqkv.weight", False),
                (b + "attn_output.weight", p + "attn.Wo.weight", False),
                (b + "ffn_norm.weight", p + "mlp_norm.weight", False),
                (b + "ffn_up.weight", p + "mlp.Wi.weight", i >= quantised_from),
                (b + "ffn_down.weight", p + "mlp.Wo.weight", i >= quantised_from)]
    out.append(("output_norm.weight", "encoder.final_norm.weight", False))
    return out


def head_tensors(layers: int, head_layers: int) -> list[tuple[str, str]]:
    """(GGUF name, checkpoint name) of the decision head (blocks after the encoder's `layers`), type
    embedding and scorer, llama.cpp's names."""
    out = []
    for j in range(head_layers):
        b, p = f"blk.{layers + j}.", f"head.layers.{j}."
        for ours, theirs in (("attn_norm", "norm1"), ("attn_qkv", "self_attn.in_proj"),
                             ("attn_output", "self_attn.out_proj"), ("ffn_norm", "norm2"), ("ffn_up", "linear1"),
                             ("ffn_down", "linear2")):
            joint = "_" if theirs.endswith("in_proj") else "."
            out += [(f"{b}{ours}.weight", f"{p}{theirs}{joint}weight"), (f"{b}{ours}.bias", f"{p}{theirs}{joint}bias")]
    out += [("token_types.weight", "type_emb.weight"), ("cls.norm.weight", "scorer.0.weight"),
            ("cls.norm.bias", "scorer.0.bias"), ("cls.weight", "scorer.1.weight"), ("cls.bias", "scorer.1.bias"),
            ("cls.output.weight", "scorer.3.weight"), ("cls.output.bias", "scorer.3.bias")]
    return out


def finish(writer: Any) -> None:
    """Write a `gguf.GGUFWriter`'s header, keys and tensors to its file, and close it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def encoder_header(writer: Any, checkpoint: Checkpoint) -> None:
    """The keys of an encoder-only GGUF (the llama runtime's working file): what llama.cpp's modern-bert
    loader reads, no tokenizer (laya tokenises and passes ids)."""
    enc, cfg = checkpoint.encoder, checkpoint.config
    a = ARCH
    writer.add_string("general.name", f"laya encoder {checkpoint.fingerprint[:16]}")
    writer.add_uint32(f"{a}.context_length", int(enc.raw.get("max_position_embeddings", 8192)))
    writer.add_uint32(f"{a}.embedding_length", enc.hidden_size)
    writer.add_uint32(f"{a}.block_count", enc.num_hidden_layers)
    writer.add_uint32(f"{a}.feed_forward_length", enc.intermediate_size)
    writer.add_uint32(f"{a}.attention.head_count", enc.num_attention_heads)
    writer.add_float32(f"{a}.attention.layer_norm_epsilon", float(enc.norm_eps))
    writer.add_bool(f"{a}.attention.causal", False)
    writer.add_uint32(f"{a}.pooling_type", 0)  # none: every token's state is read back
    writer.add_float32(f"{a}.rope.freq_base", float(enc.global_rope_theta))
    writer.add_float32(f"{a}.rope.freq_base_swa", float(enc.local_rope_theta))
    writer.add_string(f"{a}.rope.scaling.type", "none")
    local = [not enc.is_global(i) for i in range(enc.num_hidden_layers)]
    if any(local):  # with no local layer, no window: llama.cpp aborts on a window mask no layer reads
        writer.add_uint32(f"{a}.attention.sliding_window", enc.local_attention)  # the full width: it halves it
        writer.add_array(f"{a}.attention.sliding_window_pattern", local)
    writer.add_string(f"{a}.hidden_activation", "gelu")
    writer.add_uint32(f"{a}.vocab_size", enc.vocab_size)
    writer.add_string("tokenizer.ggml.model", "none")  # laya tokenises; llama.cpp only sees ids
    writer.add_uint32("laya.max_len", cfg.max_len)


def write_head(checkpoint: Checkpoint, path: Path) -> None:
    """Everything but the encoder, fp32, under the checkpoint's names (the client-side head reads it)."""
    from safetensors.numpy import save_file

    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sorted(checkpoint.weights.items())
               if not k.startswith("encoder.")}
    save_file(tensors, str(path))
