"""Reading a laya decision GGUF: llama.cpp's own laya format (`modern-bert` with `decision.type = "laya"`),
as laya's exporter or llama.cpp's converter writes it.

A file is unpacked once into the cache (`$LAYA_CACHE/gguf/<its digest>/`, keyed by the file's sha256):
- `checkpoint/`: a laya checkpoint folder (configs, the tokenizer, every weight dequantized to fp32), so
  any runtime answers from it with upstream's row rules (the state cut to `max_len`, the refusals, noul
  labels, NFC, exact JSON numbers: the same code as a checkpoint's);
- `llama/`: the llama runtime's bundle (the encoder as a GGUF of its own types, which laya's llama.cpp
  runs, the head in fp32 beside it), so the file's own precision answers without a conversion.

What llama.cpp's format does not hold is read from laya's keys when the file has them (the act head,
`max_len`, the exact tokenizer) and otherwise settled as upstream would, each assumption named in
`Unpacked.notes`: `max_len` from the published pairs (a 192-token question half goes with 512-token
rows, 256 with 1024; upstream's default is 512), the tokenizer rebuilt from the vocabulary, merges and
pre-tokenizer, and, with no act head, answers whose `x_act_probability` is null with the reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laya.digests import sha256_of
from laya.encoder.bundle import ACT_TENSORS, ARCH, build_once, encoder_tensors, head_tensors
from laya.encoder.cache import cache_root
from laya.encoder.head_layout import ACT_FEATURES, ACT_HIDDEN, NO_ACT_HEAD
from laya.errors import CheckpointError

DECISION_TYPE = f"{ARCH}.decision.type"
# upstream's published budgets: (head_max_len -> max_len); anything else takes upstream's default
PUBLISHED_MAX_LEN = {192: 512, 256: 1024}
DEFAULT_MAX_LEN = 512
BUCKETS = {"2": "2", "3_5": "3-5", "6_10": "6-10", "11": "11+"}
UNPACK_REVISION = 2


def decision_type(path: str | os.PathLike) -> str | None:
    """The file's `modern-bert.decision.type` ("laya"), or None (a chat GGUF, any other file)."""
    from laya.native.gguf_header import read_scalars

    try:
        scalars = read_scalars(path)
    except CheckpointError:
        return None
    if scalars.get("general.architecture") != ARCH:
        return None
    value = scalars.get(DECISION_TYPE)
    return value if isinstance(value, str) else None


def is_laya_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf") and Path(path).is_file() and decision_type(path) == "laya"


@dataclass
class Unpacked:
    """A laya GGUF in the cache: a checkpoint folder, the llama runtime's bundle and its manifest, and the
    assumptions made where the file said nothing."""

    checkpoint: Path
    bundle: Path
    manifest: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def unpack(path: str | os.PathLike, cache: Path | None = None) -> Unpacked:
    """The file unpacked into `cache` (default `$LAYA_CACHE/gguf`), once: later calls read what is there."""
    path = Path(path)
    if decision_type(path) != "laya":
        raise CheckpointError(f"{path}: not a laya decision GGUF (no {DECISION_TYPE} = 'laya')")
    root = (cache or cache_root() / "gguf")
    folder = root / f"{sha256_of(path)[:24]}-u{UNPACK_REVISION}"
    done = folder / "unpacked.json"
    if not done.is_file():
        build_once(folder, done.name, lambda tmp: _unpack(path, tmp))
    record = json.loads(done.read_text(encoding="utf-8"))
    manifest = json.loads((folder / "llama" / "manifest.json").read_text(encoding="utf-8"))
    return Unpacked(folder / "checkpoint", folder / "llama", manifest, record["notes"])


class _File:
    """The metadata and tensors of a GGUF, read with gguf-py."""

    def __init__(self, path: Path):
        import gguf

        try:
            self.reader = gguf.GGUFReader(str(path))
        except (OSError, ValueError, IndexError) as exc:
            raise CheckpointError(f"{path}: not a readable GGUF ({exc})") from exc
        self.path = path
        self.kv = {name: f.contents() for name, f in self.reader.fields.items() if not name.startswith("laya.act_")}
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def need(self, key: str) -> Any:
        if key not in self.kv:
            raise CheckpointError(f"{self.path}: no {key!r}: not a complete laya GGUF")
        return self.kv[key]

    def array(self, key: str) -> np.ndarray | None:
        """A float array stored under laya's keys (the act head), shaped as written, or None."""
        data, shape = self.reader.fields.get(key), self.reader.fields.get(key + ".shape")
        if data is None or shape is None:
            return None
        values = np.asarray(data.contents(), dtype=np.float32)
        return values.reshape([int(n) for n in shape.contents()])

    def weight(self, name: str) -> np.ndarray:
        """Tensor `name` as fp32, in the checkpoint's (torch's) axis order."""
        import gguf

        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor {name!r}: not a complete laya GGUF")
        t = self.tensors[name]
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.ascontiguousarray(data.reshape([int(n) for n in reversed(t.shape)]), dtype=np.float32)


def _configs(f: _File, notes: list[str]) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The encoder's config (transformers' ModernBERT keys) and `rl_agent_config.json` of the file, and
    the number of encoder layers."""
    a = ARCH
    head_layers = int(f.need(f"{a}.decision.block_count"))
    layers = int(f.need(f"{a}.block_count")) - head_layers
    ff = f.need(f"{a}.feed_forward_length")
    pattern = f.get(f"{a}.attention.sliding_window_pattern", 3)
    if isinstance(pattern, list):  # one flag per layer (True: local)
        kinds = ["sliding_attention" if local else "full_attention" for local in pattern[:layers]]
        every = 3
    else:
        every = int(pattern)
        kinds = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(layers)]
    vocab_rows = int(f.tensors["token_embd.weight"].shape[1])
    encoder = {
        "architectures": ["ModernBertModel"], "model_type": "modernbert", "vocab_size": vocab_rows,
        "hidden_size": int(f.need(f"{a}.embedding_length")),
        "intermediate_size": int(ff[0] if isinstance(ff, list) else ff),
        "num_hidden_layers": layers, "num_attention_heads": int(f.need(f"{a}.attention.head_count")),
        "norm_eps": float(f.get(f"{a}.attention.layer_norm_epsilon", 1e-5)), "norm_bias": False,
        "attention_bias": False, "mlp_bias": False, "hidden_activation": "gelu",
        "local_attention": int(f.get(f"{a}.attention.sliding_window", 128)), "global_attn_every_n_layers": every,
        "layer_types": kinds, "max_position_embeddings": int(f.get(f"{a}.context_length", 8192)),
        "global_rope_theta": float(f.get(f"{a}.rope.freq_base", 160000.0)),
        "local_rope_theta": float(f.get(f"{a}.rope.freq_base_swa", f.get(f"{a}.rope.freq_base", 160000.0))),
        "pad_token_id": f.get("tokenizer.ggml.padding_token_id"), "cls_token_id": f.get("tokenizer.ggml.bos_token_id"),
        "sep_token_id": f.get("tokenizer.ggml.seperator_token_id"),
    }
    head_max = int(f.need(f"{a}.decision.max_head_tokens"))
    max_len = f.get("laya.max_len")
    if max_len is None:
        max_len = PUBLISHED_MAX_LEN.get(head_max, DEFAULT_MAX_LEN)
        notes.append(f"max_len {max_len}: the file does not say (llama.cpp's format has no row budget); the "
                     f"published checkpoints with a {head_max}-token question half use {max_len}-token rows")
    temps, buckets = [1.0, 1.0, 1.0], {}
    prefix = f"{a}.decision.temperature."
    for key, value in f.kv.items():
        if key.startswith(prefix):
            qtype, _, bucket = key[len(prefix):].partition(".")
            if qtype in ("choice", "score", "noul") and not bucket:
                temps[("choice", "score", "noul").index(qtype)] = float(value)
            elif qtype in ("choice", "score", "noul") and bucket in BUCKETS:
                buckets[f"{qtype}:{BUCKETS[bucket]}"] = float(value)
    n_act = int(f.get("laya.n_act", 2))
    agent = {"encoder": f"gguf/{f.get('general.name', f.path.stem)}", "head_layers": head_layers,
             "act_costs": {f"act{i}": 0.0 for i in range(n_act - 1)}, "max_len": int(max_len),
             "head_max_len": head_max, "temperature": temps, "temperature_by_options": buckets,
             "option_layout": "sequential", "x_act_head": f.array("laya.act_head.0.weight") is not None,
             "x_source": f"GGUF {f.path.name}"}
    return encoder, agent, layers


def _tokenizer(f: _File, notes: list[str]) -> tuple[str, dict[str, Any]]:
    """`tokenizer.json` and `tokenizer_config.json`: laya's own copies when the file has them, else rebuilt
    from the vocabulary, merges and pre-tokenizer."""
    tokens: list[str] = list(f.need("tokenizer.ggml.tokens"))
    names = {role: tokens[int(f.need(key))] for role, key in (
        ("cls_token", "tokenizer.ggml.bos_token_id"), ("sep_token", "tokenizer.ggml.seperator_token_id"),
        ("mask_token", "tokenizer.ggml.mask_token_id"), ("pad_token", "tokenizer.ggml.padding_token_id"))
        if f.get(key) is not None}
    if "mask_token" not in names or "sep_token" not in names:
        raise CheckpointError(f"{f.path}: a decision GGUF needs its mask and separator tokens")
    if f.get("laya.tokenizer.json") is not None:
        config = json.loads(f.get("laya.tokenizer_config.json") or json.dumps(names))
        return f.get("laya.tokenizer.json"), config
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if f.get("tokenizer.ggml.model") != "gpt2":
        raise CheckpointError(f"{f.path}: tokenizer {f.get('tokenizer.ggml.model')!r}; a laya GGUF holds gpt2 (BPE)")
    types = list(f.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    kept = {t: i for i, (t, kind) in enumerate(zip(tokens, types)) if kind != 5}  # UNUSED rows pad the table
    merges = [tuple(m.split(" ", 1)) for m in f.need("tokenizer.ggml.merges")]
    unk = f.get("tokenizer.ggml.unknown_token_id")
    unk_token = tokens[int(unk)] if unk is not None else None
    tok = Tokenizer(models.BPE(vocab=dict(kept), merges=merges, unk_token=unk_token, byte_fallback="<0x00>" in kept))
    pre = f.get("tokenizer.ggml.pre", "modern-bert")
    if pre == "mmbert":  # llama.cpp's mmbert pre-tokenizer starts every text with an escaped space
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, i in kept.items()
                            if types[i] == 3])
    notes.append(f"the tokenizer was rebuilt from the file's vocabulary and merges ({pre} pre-tokenizer)")
    return tok.to_str(), names


def _weights(f: _File, layers: int, head_layers: int, notes: list[str]) -> dict[str, np.ndarray]:
    """Every checkpoint tensor, fp32, under the checkpoint's names."""
    out = {source: f.weight(name) for name, source, _ in encoder_tensors(layers)}
    out |= {source: f.weight(name) for name, source in head_tensors(layers, head_layers)}
    d = out["type_emb.weight"].shape[1]
    n_act = int(f.get("laya.n_act", 2))
    for name in ACT_TENSORS:
        value = f.array(f"laya.{name}")
        if value is None:  # shaped as the checkpoint format requires; the answers say it is absent
            shape = {"act_head.0.weight": (ACT_HIDDEN, d + ACT_FEATURES), "act_head.0.bias": (ACT_HIDDEN,),
                     "act_head.2.weight": (n_act, ACT_HIDDEN), "act_head.2.bias": (n_act,)}[name]
            value = np.zeros(shape, dtype=np.float32)
        out[name] = value
    if f.array("laya.act_head.0.weight") is None:
        notes.append(NO_ACT_HEAD)

    out["temperature"] = np.ones(3, dtype=np.float32)
    return out


def _unpack(path: Path, out: Path) -> None:
    from safetensors.numpy import save_file

    f = _File(path)
    notes: list[str] = []
    encoder, agent, layers = _configs(f, notes)
    tokenizer_json, tokenizer_config = _tokenizer(f, notes)
    weights = _weights(f, layers, agent["head_layers"], notes)
    ckpt = out / "checkpoint"
    (ckpt / "encoder").mkdir(parents=True)
    (ckpt / "tokenizer").mkdir()
    (ckpt / "rl_agent_config.json").write_text(json.dumps(agent, indent=2), encoding="utf-8")
    (ckpt / "encoder" / "config.json").write_text(json.dumps(encoder, indent=2), encoding="utf-8")
    (ckpt / "tokenizer" / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    (ckpt / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt", "source": path.name})
    _llama_bundle(f, ckpt, out / "llama", layers)
    (out / "unpacked.json").write_text(json.dumps({"source": path.name, "notes": notes}), encoding="utf-8")


def _llama_bundle(f: _File, checkpoint_folder: Path, out: Path, layers: int) -> None:
    """The llama runtime's bundle of the file: its encoder tensors, of their own types, in an encoder-only
    GGUF that laya's llama.cpp runs, and the head in fp32."""
    from laya.encoder.bundle import write_llama_bundle, write_manifest
    from laya.encoder.checkpoint import load_checkpoint

    head = {name for name in f.tensors if name.startswith("blk.") and int(name.split(".")[1]) >= layers
            or name.startswith(("token_types", "cls"))}
    kept = {name: t for name, t in f.tensors.items() if name not in head}
    kinds = {t.tensor_type.name for t in kept.values()}
    if kinds - {"F32", "F16", "Q8_0"}:
        raise CheckpointError(f"{f.path}: tensor types {sorted(kinds - {'F32', 'F16', 'Q8_0'})}: laya's "
                              "llama runtime runs f32, f16 and q8_0 (name runtime='packed' to run it dequantized)")
    precision = "q8_0" if "Q8_0" in kinds else "f16" if "F16" in kinds else "f32"

    def add_tensors(writer: Any) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name, t in kept.items():
            writer.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)  # a quantized one: its bytes
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    out.mkdir(parents=True)
    manifest = write_llama_bundle(load_checkpoint(checkpoint_folder), out, precision, add_tensors)
    gate = json.loads(f.get("laya.encoder.gate")) if f.get("laya.encoder.gate") else None
    manifest.update(source_gguf=f.path.name, gate=gate if gate is not None else _file_gate(precision))
    write_manifest(out, manifest)


def _file_gate(precision: str) -> dict[str, Any] | None:
    """A reduced-type file with no gate of laya's (one llama.cpp's converter wrote): its precision is the
    file's author's choice, run as it is; the record says no gate was measured."""
    if precision == "f32":
        return None
    return {"passed": True, "measured": False, "precision": precision,
            "note": "the file's own type, chosen by whoever made it; laya measured no gate"}
