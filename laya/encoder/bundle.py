"""Runtime bundles (ONNX, MLX, Core ML, llama.cpp GGUF) and their one manifest format.

A bundle folder holds the runtime's graph or weights, a copy of the checkpoint's configs and
tokenizer (so the same rows and decoding apply), and `manifest.json`: format version, source
checkpoint and its digest, special ids, budgets, temperatures, precision and any gate figures
measured at export. No timestamps: exporting twice writes the same bytes.

The llama runtime's bundle (an encoder-only GGUF and the fp32 head beside it) has two writers: the
exporter (`laya.encoder.export.gguf`, from a checkpoint) and the unpacking of a laya GGUF
(`laya.encoder.gguf_file`, from the file's own tensors). Both write it through `write_llama_bundle`,
here below both, so the reader of a GGUF does not import the exporters; the GGUF tensor names of a
checkpoint's weights are shared the same way by the writer of a laya GGUF and its reader.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.cache import cache_root
from laya.encoder.checkpoint import CONFIG_FILE, ENCODER_CONFIG, TOKENIZER_DIR, Checkpoint
from laya.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "laya-bundle"
FORMAT_VERSION = 1

# Bumped whenever the written file changes, so that cached bundles from an older exporter are not reused.
GGUF_REVISION = 2
ENCODER_FILE = "encoder.gguf"
HEAD_FILE = "head.safetensors"
ARCH = "modern-bert"
ACT_TENSORS = ("act_head.0.weight", "act_head.0.bias", "act_head.2.weight", "act_head.2.bias")


def is_bundle(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def bundle_to_run(checkpoint: Checkpoint, bundle: str | os.PathLike | None, runtime: str,
                  export: str | None = None) -> Path:
    """The bundle a runtime runs: the checkpoint itself when it is one, else `bundle` (what loading
    exported on first use). A runtime never exports: it says how to get one (`laya export <export>`,
    the runtime's name unless given)."""
    if is_bundle(checkpoint.path):
        return checkpoint.path
    if bundle is None:
        raise CheckpointError(f"{checkpoint.path}: the {runtime} runtime runs an exported bundle; load the checkpoint "
                              f"with laya.load(..., runtime={runtime!r}) (which exports one on first use) or run "
                              f"`laya export {export or runtime}`")
    return Path(bundle)


def open_bundle(checkpoint: Checkpoint, bundle: str | os.PathLike | None, kind: str, exact: str, *,
                force: bool = False, export: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The folder and manifest of the `kind` bundle a runtime runs (see `bundle_to_run`), checked: its
    kind, that it was exported from `checkpoint` (when the checkpoint's weights are at hand), and, for a
    precision other than `exact`, that its accuracy gate passed at export unless `force`."""
    from laya.encoder.gate import GateFailed, describe

    folder = bundle_to_run(checkpoint, bundle, kind, export=export)
    manifest = read_manifest(folder)
    if manifest.get("kind") != kind:
        raise CheckpointError(f"{folder}: a {manifest.get('kind')!r} bundle, not a {kind} one")
    if checkpoint.weights and manifest.get("fingerprint") != checkpoint.fingerprint:
        raise CheckpointError(f"{folder}: exported from another checkpoint than {checkpoint.path} "
                              "(weights, configs or tokenizer differ)")
    gate = manifest.get("gate")
    if manifest["precision"] != exact and not (gate and gate.get("passed")) and not force:
        raise GateFailed(
            f"{folder}: this {manifest['precision']} bundle failed its accuracy gate at export ("
            f"{describe(gate) if gate else 'no gate recorded'}); its answers drift from fp32 beyond the "
            f"documented bound. Use the {exact} bundle, or pass force=True to accept it", gate or {})
    return folder, manifest


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable bundle manifest ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a laya bundle manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: bundle format version {manifest.get('format_version')!r} is not "
                              f"supported (this laya reads version {FORMAT_VERSION})")
    return manifest


def base_manifest(checkpoint: Checkpoint, kind: str, precision: str) -> dict[str, Any]:
    tok, cfg = checkpoint.tokenizer, checkpoint.config
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "precision": precision,
        "source": checkpoint.source,
        "source_sha256": checkpoint.sha256,
        "special_ids": {"cls": tok.cls_id, "sep": tok.sep_id, "mask": tok.mask_id, "pad": tok.pad_id},
        "max_len": cfg.max_len,
        "head_max_len": cfg.head_max_len,
        "temperature": list(cfg.temperature),
        "temperature_by_options": dict(cfg.temperature_by_options),
        "fingerprint": checkpoint.fingerprint,
    }


def copy_checkpoint_files(checkpoint: Checkpoint, out: Path) -> None:
    """The configs and tokenizer a runtime needs beside its graph (never the weights)."""
    (out / "encoder").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(checkpoint.path / CONFIG_FILE, out / CONFIG_FILE)
    shutil.copyfile(checkpoint.path / ENCODER_CONFIG, out / ENCODER_CONFIG)
    if (out / TOKENIZER_DIR).exists():
        shutil.rmtree(out / TOKENIZER_DIR)
    shutil.copytree(checkpoint.path / TOKENIZER_DIR, out / TOKENIZER_DIR)


def write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def cache_folder(kind: str, key: str, cache_dir: Path | None = None) -> Path:
    """Where `cached_export` keeps the bundle `key` of `kind` (complete when its manifest is there)."""
    return (cache_dir or cache_root() / kind) / key


def cached_export(kind: str, key: str, build: Callable[[Path], Any], cache_dir: Path | None = None) -> Path:
    """A bundle exported on first use into `$LAYA_CACHE/<kind>/<key>` (default ~/.cache/laya), built once
    (`build_once`)."""
    folder = cache_folder(kind, key, cache_dir)
    if (folder / MANIFEST).is_file():
        return folder
    logging.getLogger("laya").info("exporting a %s bundle on first use into %s (once: later loads reuse it)",
                                   kind, folder)
    build_once(folder, MANIFEST, build)
    return folder


def build_once(folder: Path, done: str, build: Callable[[Path], Any]) -> None:
    """`build` `folder`, complete when it holds the file `done`.

    Each process builds in a temporary folder of its own and renames it into place when complete, so
    an interrupted build is never taken for a finished one and concurrent processes (server workers)
    never write into each other's files: the first rename wins and the others discard their copy."""
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=root))
    try:
        build(tmp)
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / done).is_file():  # not another process's finished build: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


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


def write_llama_bundle(checkpoint: Checkpoint, out: Path, precision: str,
                       add_tensors: Callable[[Any], dict[str, int]]) -> dict[str, Any]:
    """The llama runtime's bundle in `out`: the checkpoint's configs and tokenizer, the encoder GGUF
    (its header here, its tensors from `add_tensors`, which returns how many each GGML type holds) and
    the fp32 head. Returns the manifest for the caller to complete and write."""
    import gguf

    copy_checkpoint_files(checkpoint, out)
    writer = gguf.GGUFWriter(str(out / ENCODER_FILE), ARCH)
    encoder_header(writer, checkpoint)
    counts = add_tensors(writer)
    finish(writer)
    write_head(checkpoint, out / HEAD_FILE)
    manifest = base_manifest(checkpoint, "llama", precision)
    manifest.update(encoder=ENCODER_FILE, head=HEAD_FILE, architecture=ARCH, gguf_revision=GGUF_REVISION,
                    tensor_types=counts)
    return manifest
