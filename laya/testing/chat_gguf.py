"""Deterministic generator of tiny llama-architecture GGUFs that llama.cpp loads, for fast tests of
the decide engine's llama.cpp adapter (random weights; a byte-level SentencePiece-style vocabulary).

The vocabulary: <unk>, BOS, EOS and the control tokens of the chosen chat template family
(`TEMPLATES`: ChatML, Llama-3, Gemma, or none), every printable ASCII character as a normal token
(so "A" or "7" is one token) and the 256 byte tokens for everything else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>"
          "\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
          "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA = ("{{ bos_token }}{% for message in messages %}<start_of_turn>"
         "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{{ message['content'] | trim }}"
         "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

# family -> (template, BOS text, EOS text, other control tokens, user-defined markup tokens)
TEMPLATES: dict[str, tuple[str | None, str, str, tuple[str, ...], tuple[str, ...]]] = {
    "chatml": (CHATML, "<s>", "</s>", ("<|im_start|>", "<|im_end|>"), ()),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>", ("<|start_header_id|>", "<|end_header_id|>",
                                                                 "<|eot_id|>"), ()),
    # Gemma's turn markers as user-defined tokens: llama.cpp matches those even without special parsing
    "gemma": (GEMMA, "<bos>", "<eos>", (), ("<start_of_turn>", "<end_of_turn>")),
    "raw": (None, "<s>", "</s>", (), ()),
}


def write_tiny_gguf(path: str | Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                    n_ff: int = 128, n_ctx: int = 1024, family: str = "chatml") -> Path:
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chat_template, bos, eos, control, user_defined = TEMPLATES[family]
    tokens: list[str] = ["<unk>", bos, eos, *control, *user_defined]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             *[gguf.TokenType.CONTROL] * len(control), *[gguf.TokenType.USER_DEFINED] * len(user_defined)]
    n_special = len(tokens)
    for code in range(32, 127):
        tokens.append("▁" if chr(code) == " " else chr(code))
        types.append(gguf.TokenType.NORMAL)
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        types.append(gguf.TokenType.BYTE)
    scores = [0.0] * n_special + [-float(i) for i in range(95)] + [-1000.0] * 256
    n_vocab = len(tokens)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("laya-tiny-test")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(False)
    if chat_template:
        writer.add_chat_template(chat_template)

    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, scale: float | None = None):
        data = np.ones(shape, np.float32) if scale is None else (scale * rng.standard_normal(shape)).astype(np.float32)
        writer.add_tensor(name, data)

    tensor("token_embd.weight", n_vocab, n_embd, scale=1.0)
    for i in range(n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd)
        for proj in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{proj}.weight", n_embd, n_embd, scale=0.3 / np.sqrt(n_embd) * 4)
        tensor(f"blk.{i}.ffn_norm.weight", n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd, scale=1 / np.sqrt(n_embd))
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd, scale=1 / np.sqrt(n_embd))
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff, scale=1 / np.sqrt(n_ff))
    tensor("output_norm.weight", n_embd)
    tensor("output.weight", n_vocab, n_embd, scale=2 / np.sqrt(n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
