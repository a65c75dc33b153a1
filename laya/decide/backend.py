"""The port between the decide policy and a live language model.

Everything the policy needs, and nothing else: render a user message with the model's chat
template, tokenize, prefill tokens after the current state, the last token's logits, and saving and
restoring the whole sequence state. A scripted backend implements it in tests.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class DecideBackend(Protocol):
    n_ctx: int
    n_vocab: int
    templated: bool  # whether `render` applies a chat template (else the text is a raw prompt)

    def render(self, message: str) -> str:
        """The prompt for one user message, assistant turn opened, reasoning off."""
        ...

    def tokenize(self, text: str, *, prompt: bool) -> list[int]:
        """`prompt=True`: a whole rendered prompt (BOS and special tokens as the model wants);
        `prompt=False`: a bare answer label, no BOS, no special tokens."""
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
