"""Deterministic generator of small checkpoints in the exact laya format, for tests and goldens.

Two flavours mirror the two published encoders: `modernbert` (byte-level BPE with [CLS] [SEP]
[MASK] [PAD] [UNK], RoPE 160000 / 10000 in the classic config keys) and `mmbert` (a metaspace BPE
with <bos> <eos> <mask> <pad> <unk> at mmBERT's ids, RoPE 160000 / 160000 in transformers-5's
`rope_parameters`, a `TokenizersBackend` tokenizer config with list-valued extra special tokens).
Weights are random but scaled so option logits spread over several units, and stored in fp16 like
the published checkpoints. The same arguments always give the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.config import AgentConfig, EncoderConfig
from laya.encoder.head_layout import checkpoint_tensors

CORPUS = Path(__file__).with_name("corpus.txt")

DEFAULT_TEMPERATURE = [1.3, 0.9, 1.6]
DEFAULT_BUCKETS = {
    "choice:2": 1.2,
    "choice:3-5": 1.7,
    "choice:6-10": 0.8,
    "choice:11+": 0.1006,  # out of range on purpose, like the English checkpoint: clamped to 0.5
    "score:3-5": 1.1,
    "noul:2": 2.0,
}


@dataclass(frozen=True)
class TestCheckpointSpec:
    flavour: str = "modernbert"
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 2
    intermediate_size: int = 128
    head_layers: int = 2
    local_attention: int = 16
    vocab_target: int = 700
    max_len: int = 256
    head_max_len: int = 96
    temperature: list[float] = field(default_factory=lambda: list(DEFAULT_TEMPERATURE))
    temperature_by_options: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))
    vocab_size: int | None = None  # embedding rows; default: tokenizer size rounded up to 64
    # the spread of attention logits q.k/sqrt(d_head) (None: Wqkv's fixed std 0.12, peaked at d 128)
    attention_logit_std: float | None = None
    scorer_gain: float = 2.5  # the scorer's last layer: larger gives more confident answers
    # the encoder layers' output projections (attention's and the MLP's Wo): below 1, each layer moves the
    # residual stream less and the tokens' own embeddings survive a deep stack, as in a pretrained encoder
    residual_gain: float = 1.0


# Checkpoints on which reduced precision is hard (the accuracy gates are measured on them): attention
# that depends on content without being one-hot at any width (logits of spread ~4, where a rounding of
# the logits moves the softmax most), and answers in the middle of the probability range (where a change
# of a logit moves the probability most), as in the golden checkpoints.
ADVERSARIAL = {"attention_logit_std": 4.0, "scorer_gain": 1.0}


def _train_tokenizer(flavour: str, vocab_target: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    if flavour == "modernbert":
        specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_target, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(lines, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
        )
        names = {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                 "unk_token": "[UNK]"}
    elif flavour == "mmbert":
        specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # ids 0..4, as in mmBERT
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
        trainer = trainers.BpeTrainer(vocab_size=vocab_target, special_tokens=specials, show_progress=False)
        tok.train_from_iterator(lines, trainer)
        names = {"cls_token": "<bos>", "sep_token": "<eos>", "mask_token": "<mask>", "pad_token": "<pad>",
                 "unk_token": "<unk>"}
    else:
        raise ValueError(f"unknown flavour {flavour!r}; use 'modernbert' or 'mmbert'")
    return tok, names


def _tokenizer_config(flavour: str, names: dict[str, str]) -> dict[str, Any]:
    if flavour == "mmbert":
        # transformers 5 writes these; a loader must accept them without rewriting the file.
        return {"tokenizer_class": "TokenizersBackend", "backend": "tokenizers", "is_local": False,
                "model_max_length": 8192, "extra_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
                **names}
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
            "clean_up_tokenization_spaces": True, **names}


def _encoder_config(spec: TestCheckpointSpec, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    base = {
        "architectures": ["ModernBertModel"], "model_type": "modernbert", "vocab_size": vocab,
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5, "norm_bias": False,
        "attention_bias": False, "mlp_bias": False, "local_attention": spec.local_attention,
        "global_attn_every_n_layers": 3, "pad_token_id": ids["pad"], "cls_token_id": ids["cls"],
        "sep_token_id": ids["sep"], "bos_token_id": ids["cls"], "eos_token_id": ids["sep"],
        "classifier_pooling": "mean", "initializer_range": 0.02,
    }
    if spec.flavour == "mmbert":
        base["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 160000.0},
        }
        base["layer_types"] = ["full_attention" if i % 3 == 0 else "sliding_attention"
                               for i in range(spec.num_layers)]
        base["transformers_version"] = "5.0.0"
    else:
        base["global_rope_theta"] = 160000.0
        base["local_rope_theta"] = 10000.0
    return base


def _weights(spec: TestCheckpointSpec, agent: AgentConfig, enc: EncoderConfig) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    d = spec.hidden_size
    out: dict[str, np.ndarray] = {}
    for name, shape in checkpoint_tensors(agent, enc).items():
        leaf = name.rsplit(".", 1)[-1]
        is_norm = ("norm" in name or name.startswith("scorer.0.")) and len(shape) == 1
        if name == "temperature":
            value = np.ones(shape)
        elif is_norm and leaf == "weight":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif is_norm:
            value = 0.05 * rng.standard_normal(shape)
        elif name.endswith("tok_embeddings.weight"):
            value = rng.standard_normal(shape)
        elif name == "type_emb.weight":
            value = 0.5 * rng.standard_normal(shape)
        elif leaf.endswith("bias"):
            value = 0.02 * rng.standard_normal(shape)
        elif "attn.Wqkv" in name and spec.attention_logit_std is not None:
            value = np.sqrt(spec.attention_logit_std / d) * rng.standard_normal(shape)  # q.k/sqrt(dh) ~ std^2 d
        elif "attn.Wqkv" in name or "in_proj_weight" in name:
            value = 0.12 * rng.standard_normal(shape)  # peaked attention: options see different context
        elif name.startswith("scorer.1."):
            value = (2.0 / np.sqrt(d)) * rng.standard_normal(shape)
        elif name.startswith("scorer.3."):
            value = (spec.scorer_gain / np.sqrt(d)) * rng.standard_normal(shape)
        else:
            value = (1.0 / np.sqrt(shape[1])) * rng.standard_normal(shape)
            if name.startswith("encoder.layers.") and name.endswith("Wo.weight"):
                value = spec.residual_gain * value
        out[name] = value.astype(np.float16)
    return out


def write_test_checkpoint(folder: str | Path, spec: TestCheckpointSpec | None = None) -> Path:
    """Write a checkpoint folder (config, weights, encoder config, tokenizer) and return its path."""
    from safetensors.numpy import save_file

    spec = spec or TestCheckpointSpec()
    folder = Path(folder)
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    (folder / "encoder").mkdir(parents=True, exist_ok=True)
    tok, names = _train_tokenizer(spec.flavour, spec.vocab_target)
    ids = {"cls": tok.token_to_id(names["cls_token"]), "sep": tok.token_to_id(names["sep_token"]),
           "pad": tok.token_to_id(names["pad_token"])}
    n_tokens = tok.get_vocab_size(with_added_tokens=True)
    vocab = spec.vocab_size or ((n_tokens + 63) // 64) * 64
    tok.save(str(folder / "tokenizer" / "tokenizer.json"))
    _dump(folder / "tokenizer" / "tokenizer_config.json", _tokenizer_config(spec.flavour, names))
    encoder_cfg = _encoder_config(spec, vocab, ids)
    _dump(folder / "encoder" / "config.json", encoder_cfg)
    agent_cfg = {
        "encoder": f"generated/tiny-{spec.flavour}", "head_layers": spec.head_layers,
        "act_costs": {"escalate": 0.25}, "max_len": spec.max_len, "head_max_len": spec.head_max_len,
        "temperature": spec.temperature, "temperature_by_options": spec.temperature_by_options,
        "option_layout": "sequential", "generator": "laya.testing.checkpoints", "seed": spec.seed,
    }
    _dump(folder / "rl_agent_config.json", agent_cfg)
    agent = AgentConfig.from_dict(agent_cfg, folder / "rl_agent_config.json")
    enc = EncoderConfig.from_dict(encoder_cfg, folder / "encoder" / "config.json")
    save_file(_weights(spec, agent, enc), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write a small laya-format checkpoint with random weights")
    parser.add_argument("out")
    parser.add_argument("--flavour", choices=["modernbert", "mmbert"], default="modernbert")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_test_checkpoint(args.out, TestCheckpointSpec(flavour=args.flavour, seed=args.seed)))


if __name__ == "__main__":
    main()
