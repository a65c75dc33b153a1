"""The llama runtime's bundle as it is written: its file names, its revision, the encoder GGUF's header
and the fp32 head beside it.

Two writers make this bundle: the exporter (`laya.encoder.export.gguf`, from a checkpoint) and the
unpacking of a laya GGUF (`laya.encoder.gguf_file`, from the file's own tensors). They share these
pieces from here, below both, so the reader of a GGUF does not import the exporters, which import it
to measure a file read back (`laya.encoder.export.laya_gguf`).
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
