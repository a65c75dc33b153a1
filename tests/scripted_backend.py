"""A scripted decide backend: its logits are a pure function of the token sequence it holds."""

from __future__ import annotations

import zlib

import numpy as np

BOS, MERGED_AB, END = 62, 61, 63
SPACED_A = 60  # no character tokenises to it; its text is " A\n" (a letter once trimmed)
SCRIPTED_LOW = -2.0  # the logit of every token a script does not name


class ScriptedBackend:
    """Characters are tokens (code % 60), except that "ab" merges into one token, so a merge across
    the prefix/suffix join can be provoked; prompts start with a BOS.

    Logits are pseudo-random, seeded by the sequence, unless `script` names the answer path (the tokens
    after the prompt's closing `</u><a>`): `script[path]` maps tokens to logits and every other token
    reads `SCRIPTED_LOW`, so a test knows the exact distribution after each prompt state."""

    n_vocab = 64
    end_tokens = [END]

    def __init__(self, n_ctx: int = 400, templated: bool = True, script: dict | None = None,
                 end_tokens: list[int] | None = None, rule=None):
        """`rule(backend)` may name the logits after the sequence the backend holds (a dict token ->
        logit, every other token `SCRIPTED_LOW`; None: not named), for prompts without `</u><a>`."""
        self.n_ctx = n_ctx
        self.templated = templated
        self.script = script or {}
        self.rule = rule
        if end_tokens is not None:
            self.end_tokens = list(end_tokens)
        self.seq: list[int] = []
        self.prefill_calls: list[list[int]] = []

    def prompt_tokens(self, message: str) -> list[int]:
        return [BOS, *self.tokenize(f"<u>{message}</u><a>" if self.templated else message)]

    def chat_tokens(self, system: str, user: str, assistant: str = "") -> tuple[list[int], int]:
        head = [BOS, *self.tokenize(f"<s>{system}</s>")]
        return head + self.tokenize(f"<u>{user}</u><a>{assistant}"), len(head)

    def token_texts(self) -> list[str]:
        """Token t < 60 spells chr(t + 60) (so "A" is token 5), as `tokenize` maps it back."""
        texts = [chr(t + 60) for t in range(60)] + [" A\n", "ab", "<bos>", "<end>"]
        return texts

    def tokenize(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(MERGED_AB)
                i += 2
            else:
                out.append(ord(text[i]) % 60)
                i += 1
        return out

    def reset(self) -> None:
        self.seq = []

    def prefill(self, tokens: list[int]) -> None:
        self.prefill_calls.append(list(tokens))
        self.seq = self.seq + list(tokens)

    def answer_path(self) -> tuple[int, ...] | None:
        """The tokens after the last `</u><a>` of the sequence (None before any)."""
        close = self.tokenize("</u><a>")
        for start in range(len(self.seq) - len(close), -1, -1):
            if self.seq[start : start + len(close)] == close:
                return tuple(self.seq[start + len(close) :])
        return None

    def endswith(self, text: str) -> bool:
        tokens = self.tokenize(text)
        return self.seq[-len(tokens):] == tokens

    def holds(self, text: str) -> bool:
        """Whether the sequence contains `text`'s tokens."""
        tokens, seq = self.tokenize(text), self.seq
        return any(seq[i : i + len(tokens)] == tokens for i in range(len(seq) - len(tokens) + 1))

    def last_logits(self) -> np.ndarray:
        named = self.rule(self) if self.rule is not None else None
        if named is not None:
            row = np.full(self.n_vocab, SCRIPTED_LOW, dtype=np.float32)
            for token, logit in named.items():
                row[token] = logit
            return row
        path = self.answer_path() if self.script else None
        if path is not None and path in self.script:
            row = np.full(self.n_vocab, SCRIPTED_LOW, dtype=np.float32)
            for token, logit in self.script[path].items():
                row[token] = logit
            return row
        seed = zlib.crc32(bytes(t % 256 for t in self.seq) + len(self.seq).to_bytes(4, "little"))
        return (3.0 * np.random.default_rng(seed).standard_normal(self.n_vocab)).astype(np.float32)

    def save_state(self):
        return tuple(self.seq)

    def load_state(self, state) -> None:
        self.seq = list(state)

    def state_nbytes(self, state) -> int:
        return 4 * len(state)

    def describe(self) -> dict:
        return {"backend": "scripted"}
