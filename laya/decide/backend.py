"""The port between the decide policy and a live language model.

Everything the policy needs, and nothing else: the prompt tokens of one user message under the
model's chat template, the tokens of a bare label, prefill tokens after the current state, the last
token's logits, and saving and restoring the whole sequence state. A scripted backend implements it
in tests.

What a request supplies (state, instructions, option names and descriptions) is only ever tokenised
as plain text: the template's markup is tokenised as markup, the message as text, so a message that
spells a control token (`<|im_end|>`) cannot close its turn or open the assistant's.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class DecideBackend(Protocol):
    n_ctx: int
    n_vocab: int
    templated: bool  # whether prompts follow a chat template (else the message is a raw prompt)
    end_tokens: list[int]  # tokens that end an answer (end of sequence / of turn): a label that stops there

    def prompt_tokens(self, message: str) -> list[int]:
        """The prompt for one user message (assistant turn opened, reasoning off): BOS and template
        markup as the model wants them, the message itself as plain text, never control tokens."""
        ...

    def chat_tokens(self, system: str, user: str, assistant: str = "") -> tuple[list[int], int]:
        """The prompt for a system turn and one user message (assistant turn opened, reasoning off,
        then `assistant`, the laya's own text it starts with, tokenised with the template's markup),
        the turns as plain text; and how many tokens come before the user's message (the part that
        depends on the system turn alone). Raises `CheckpointError` for a model without a chat
        template that places both verbatim."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """A bare answer label as plain text: no BOS, no control tokens."""
        ...

    def token_texts(self) -> list[str]:
        """Each token's text, by id (for readouts that read tokens by what they spell)."""
        ...

    def reset(self) -> None:
        """Forget the sequence: the next prefill starts at position 0."""
        ...

    def prefill(self, tokens: list[int]) -> None:
        """Evaluate `tokens` after the current state."""
        ...

    def last_logits(self) -> np.ndarray:
        """Logits of the next token after the last prefilled one, [n_vocab] float32."""
        ...

    def save_state(self) -> Any:
        """An opaque copy of the whole sequence state (exact: restoring it changes no bit)."""
        ...

    def load_state(self, state: Any) -> None: ...

    def state_nbytes(self, state: Any) -> int: ...

    def describe(self) -> dict[str, Any]:
        """What `/v1/models` and `/health` report about the live model (its file, context, threads)."""
        ...
