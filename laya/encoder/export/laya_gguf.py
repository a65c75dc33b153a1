"""`laya export gguf`: one self-contained file in mainline llama.cpp's laya format.

Since build b11361, llama.cpp serves laya decision models itself (`llama-server -m Laya-Q8_0.gguf`
answers `POST /v1/systemone`), from a GGUF its converter writes: `general.architecture` `modern-bert`
with `modern-bert.decision.type = "laya"`, the decision head's layers as extra blocks after the
encoder's (`blk.N.*`, with biases), the type embedding as `token_types.weight`, the scorer as
`cls.norm.*`, `cls.*`, `cls.output.*`, the temperatures as `modern-bert.decision.temperature.<type>`
and `.<type>.<bucket>`, a BPE vocabulary (`tokenizer.ggml.model = "gpt2"`) and a `systemone` chat
template that renders the row. This writes that file, so stock llama.cpp (and `xllamacpp`) load it,
and laya reads it back (`laya.encoder.gguf_file`).

What llama.cpp's file has no place for rides along under keys it ignores (`laya.*`): the act head
(its tensors as float arrays: llama.cpp refuses a file with tensors it does not use), `max_len`, the
exact tokenizer, the source checkpoint's digest and the gate. The temperatures are written as upstream
loads them (clamped to [0.5, 5]), where llama.cpp's converter writes them raw.

Types: `f32`, `f16` and `q8_0`, the encoder's matrices as the llama bundle stores them
(`laya/encoder/export/gguf.py`: q8_0 holds the later half's feed-forward matrices in Q8_0, the rest f16), the head,
scorer, type embedding and every norm and bias f32. f16 and q8_0 are gated against the fp32 reference,
on this very file read back.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.bundle import ACT_TENSORS, ARCH, finish
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.export.gguf import check_expressible, write_tensors
from laya.errors import CheckpointError

FORMAT_REVISION = 1  # `laya.format_revision`: bumped whenever what laya writes under its own keys changes
TYPE_NAMES = ("choice", "score", "noul")
# upstream's temperature buckets -> llama.cpp's key suffixes (`choice:3-5` -> `choice.3_5`)
BUCKET_SUFFIX = {"2": "2", "3-5": "3_5", "6-10": "6_10", "11+": "11"}


def _template(cls: str, sep: str, mask: str) -> str:
    """The `systemone` template: the row's text with the model's own special tokens, as llama.cpp's
    converter writes it (llama.cpp renders it and checks the layout CLS question SEP (MASK option)* SEP
    state SEP)."""
    def text(name: str) -> str:
        return "{{ " + name + " if " + name + " is string else " + name + " | tojson }}"

    described = text("o.description")
    option = ("{% if type == 'choice' %}{{ o.key }}{% if o.description %}: " + described + "{% endif %}"
              "{% elif type == 'score' %}level {{ o.key }}: " + described
              + "{% else %}{{ o.key }}: {% if o.description %}" + described
              + "{% elif o.key == 'true' %}yes, the statement holds{% else %}no, the statement does not hold"
              "{% endif %}{% endif %}")
    return (cls + "{{ type }} question: " + text("instructions") + sep + "{% for o in options %}" + mask + " "
            + option + "{% endfor %}" + sep + text("state") + sep)


def vocabulary(checkpoint: Checkpoint) -> dict[str, Any]:
    """The tokenizer as llama.cpp's `gpt2` (BPE) vocabulary: tokens by id (padded to the embedding rows),
    their types, the merges and the pre-tokenizer; refused, naming why, when llama.cpp has no match."""
    data = json.loads((checkpoint.path / "tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise CheckpointError(f"{checkpoint.path}: a {model.get('type')} tokenizer; llama.cpp's laya format holds BPE")
    kinds = {str(p.get("type")) for p in _pre_tokenizers(data.get("pre_tokenizer"))}
    if "ByteLevel" in kinds:
        pre = "modern-bert"
    elif "Metaspace" in kinds:
        pre = "mmbert"
    else:
        raise CheckpointError(f"{checkpoint.path}: pre-tokenizer {sorted(kinds) or 'none'} has no llama.cpp match "
                              "(ByteLevel: modern-bert, Metaspace: mmbert)")
    size = checkpoint.encoder.vocab_size
    tokens: list[str | None] = [None] * size
    for token, i in model["vocab"].items():
        if i < size:
            tokens[i] = token
    special = set()
    for added in data.get("added_tokens") or []:
        if added["id"] < size:
            tokens[added["id"]] = added["content"]
            if added.get("special"):
                special.add(added["id"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    types = [3 if i in special else 5 if t is None else 1 for i, t in enumerate(tokens)]  # CONTROL, UNUSED, NORMAL
    names = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    unk = model.get("unk_token")
    return {"tokens": names, "types": types, "merges": merges, "pre": pre, "json": json.dumps(data),
            "unk": model["vocab"].get(unk) if unk is not None else None,
            "llama_cpp": _tokenizer_notes(data, pre)}


def _tokenizer_notes(data: dict[str, Any], pre: str) -> list[str]:
    """Where stock llama.cpp will tokenize this vocabulary otherwise than the checkpoint's own tokenizer
    (laya reads its exact copy; llama.cpp re-implements the pre-tokenizer it names)."""
    if pre != "mmbert":
        return []
    notes = []
    schemes = {str(p.get("prepend_scheme", "always")) for p in _pre_tokenizers(data.get("pre_tokenizer"))
               if p.get("type") == "Metaspace"}
    if schemes - {"first", "always"}:
        notes.append(f"the tokenizer's Metaspace prepend_scheme is {sorted(schemes)}; llama.cpp's mmbert "
                     "pre-tokenizer starts every text with an escaped space, so its rows will differ from laya's")
    if not (data.get("model") or {}).get("byte_fallback"):
        notes.append("the tokenizer has no byte fallback, which llama.cpp's mmbert tokenizer assumes: text "
                     "outside the vocabulary may be tokenized differently there")
    return notes


def _pre_tokenizers(pre: Any) -> list[dict[str, Any]]:
    """The pre-tokenizers a tokenizer.json's `pre_tokenizer` applies, a `Sequence`'s flattened."""
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        return [p for part in pre.get("pretokenizers") or [] for p in _pre_tokenizers(part)]
    return [pre]


def write_laya_gguf(checkpoint: Checkpoint, path: Path, gguf_type: str, gate: dict[str, Any] | None = None,
                    extras: bool = True) -> dict[str, int]:
    """The checkpoint as one llama.cpp laya GGUF; returns how many tensors each GGML type holds.
    `extras=False` leaves laya's own keys out (the file llama.cpp's converter would write, clamped)."""
    import gguf

    check_expressible(checkpoint, gguf_type)
    enc, cfg, tok = checkpoint.encoder, checkpoint.config, checkpoint.tokenizer
    vocab = vocabulary(checkpoint)
    writer = gguf.GGUFWriter(str(path), ARCH)
    a = ARCH
    # no "modern-bert" in the name: llama.cpp then strips the whitespace before [MASK], which upstream keeps
    writer.add_name(f"laya {checkpoint.path.name}"[:120])
    writer.add_context_length(int(enc.raw.get("max_position_embeddings", 8192)))
    writer.add_embedding_length(enc.hidden_size)
    writer.add_block_count(enc.num_hidden_layers + cfg.head_layers)
    writer.add_feed_forward_length([enc.intermediate_size] * enc.num_hidden_layers
                                   + [4 * enc.hidden_size] * cfg.head_layers)
    writer.add_head_count(enc.num_attention_heads)
    writer.add_layer_norm_eps(float(enc.norm_eps))
    writer.add_causal_attention(False)
    writer.add_rope_freq_base(float(enc.global_rope_theta))
    writer.add_rope_freq_base_swa(float(enc.local_rope_theta))
    writer.add_rope_scaling_type(gguf.RopeScalingType.NONE)
    writer.add_sliding_window(enc.local_attention)  # the full width: llama.cpp halves it itself
    writer.add_sliding_window_pattern(enc.global_attn_every_n_layers)
    writer.add_string(f"{a}.hidden_activation", "gelu")
    writer.add_vocab_size(enc.vocab_size)
    writer.add_string(f"{a}.decision.type", "laya")
    writer.add_uint32(f"{a}.decision.block_count", cfg.head_layers)
    writer.add_uint32(f"{a}.decision.max_head_tokens", cfg.head_max_len)
    for name, value in temperatures(checkpoint).items():
        writer.add_float32(f"{a}.decision.temperature.{name}", value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab["pre"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_token_type_count(3)  # one per question type: llama.cpp requires it
    writer.add_bos_token_id(tok.cls_id)
    writer.add_eos_token_id(tok.sep_id)
    writer.add_sep_token_id(tok.sep_id)
    writer.add_pad_token_id(tok.pad_id)
    writer.add_mask_token_id(tok.mask_id)
    if vocab["unk"] is not None:
        writer.add_unk_token_id(vocab["unk"])
    for adds in (writer.add_add_bos_token, writer.add_add_eos_token, writer.add_add_sep_token):
        adds(True)
    writer.add_chat_template([{"name": "systemone", "template": _template(tok.cls_token, tok.sep_token,
                                                                          tok.mask_token)}])
    if extras:
        _write_extras(writer, checkpoint, vocab, gate)
    counts = write_tensors(writer, checkpoint, gguf_type, head=True)
    finish(writer)
    return counts


def temperatures(checkpoint: Checkpoint) -> dict[str, float]:
    """The temperature keys' suffixes and values, clamped as upstream loads them (a checkpoint's raw
    0.1006 for 11+ options is 0.5 in every answer upstream gives)."""
    from laya.calibration.temperatures import Temperatures

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the clamp was reported when the checkpoint was loaded
        temps = Temperatures.from_raw(checkpoint.config.temperature, checkpoint.config.temperature_by_options,
                                      source="export")
    out = {name: float(t) for name, t in zip(TYPE_NAMES, temps.per_type)}
    for key, t in temps.by_bucket.items():
        qtype, _, bucket = key.partition(":")
        if qtype in TYPE_NAMES and bucket in BUCKET_SUFFIX:
            out[f"{qtype}.{BUCKET_SUFFIX[bucket]}"] = float(t)
    return out


def _write_extras(writer: Any, checkpoint: Checkpoint, vocab: dict[str, Any], gate: dict[str, Any] | None) -> None:
    cfg = checkpoint.config
    writer.add_uint32("laya.format_revision", FORMAT_REVISION)
    writer.add_uint32("laya.max_len", cfg.max_len)
    writer.add_uint32("laya.n_act", cfg.n_act)
    writer.add_string("laya.source_sha256", checkpoint.sha256)
    writer.add_string("laya.fingerprint", checkpoint.fingerprint)
    writer.add_string("laya.tokenizer.json", vocab["json"])
    writer.add_string("laya.tokenizer_config.json", (checkpoint.path / "tokenizer" / "tokenizer_config.json")
                      .read_text(encoding="utf-8"))
    if gate is not None:
        writer.add_string("laya.encoder.gate", json.dumps(gate, sort_keys=True))
    for name in ACT_TENSORS:  # as float arrays: llama.cpp refuses a file holding tensors it does not read
        value = np.ascontiguousarray(checkpoint.weights[name], dtype=np.float32)
        writer.add_array(f"laya.{name}.shape", list(value.shape))
        writer.add_array(f"laya.{name}", value.ravel().tolist())


def export(checkpoint: Checkpoint, out: Path | str, gguf_type: str = "f32",
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write `out` (one .gguf file) and return what it holds: types, the gate of a reduced type (measured
    on the file read back, against the fp32 reference) and its digest."""
    say = progress or (lambda _msg: None)
    out = Path(out)
    if out.suffix != ".gguf":
        raise CheckpointError(f"{out}: a laya GGUF is one file named *.gguf")
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    say(f"writing {out.name} ({gguf_type}, llama.cpp's laya format)")
    counts = write_laya_gguf(checkpoint, out, gguf_type)
    notes = vocabulary(checkpoint)["llama_cpp"]
    for note in notes:
        say(f"note for stock llama.cpp: {note}")
    gate = None
    if gguf_type != "f32":
        say(f"measuring the {gguf_type} gate on the file read back, against the fp32 reference")
        gate = measure_gate(checkpoint, out)
        write_laya_gguf(checkpoint, out, gguf_type, gate=gate)
    say(f"done in {time.perf_counter() - started:.1f} s: {out}")
    return {"path": str(out), "type": gguf_type, "tensor_types": counts, "gate": gate, "llama_cpp_notes": notes}


def measure_gate(checkpoint: Checkpoint, path: Path) -> dict[str, Any]:
    """The file's reduced type against fp32, as laya's llama runtime runs it (unpacked into a temporary
    cache: the round trip is part of what is measured)."""
    import tempfile

    from laya.encoder.export import gguf
    from laya.encoder.gguf_file import unpack

    with tempfile.TemporaryDirectory() as tmp:
        unpacked = unpack(path, Path(tmp))
        return gguf.measure_gate(checkpoint, unpacked.bundle, unpacked.manifest)
