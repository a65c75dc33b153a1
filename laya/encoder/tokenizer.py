"""The checkpoint's tokenizer, through the `tokenizers` library alone.

transformers' AutoTokenizer is not needed (and trips over transformers-5 configs that say
`tokenizer_class: "TokenizersBackend"` or store `extra_special_tokens` as a list): `tokenizer.json`
gives the ids and `tokenizer_config.json` names the special tokens. Nothing is ever written back
into the checkpoint folder, which may be a read-only Hub snapshot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laya.errors import CheckpointError

SPECIAL_ROLES = ("cls_token", "sep_token", "mask_token", "pad_token")
# What transformers' `clean_up_tokenization` closes up, in its order.
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _token_string(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


@dataclass
class Tokenizer:
    """Text to ids without special tokens, plus the four special tokens a row needs."""

    backend: Any  # tokenizers.Tokenizer
    cls_token: str
    sep_token: str
    mask_token: str
    pad_token: str
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    path: Path
    clean_up_spaces: bool = False  # tokenizer_config's clean_up_tokenization_spaces, which decode follows

    @classmethod
    def from_dir(cls, folder: Path) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        tok_file = folder / "tokenizer.json"
        cfg_file = folder / "tokenizer_config.json"
        if not tok_file.is_file():
            raise CheckpointError(f"{tok_file}: file not found")
        if not cfg_file.is_file():
            raise CheckpointError(f"{cfg_file}: file not found")
        try:
            backend = Backend.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise CheckpointError(f"{tok_file}: cannot be read as a tokenizers file ({exc})") from exc
        # A tokenizer.json may carry truncation or padding settings; rows are cut by our own rules.
        backend.no_truncation()
        backend.no_padding()
        try:
            config = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{cfg_file}: not valid JSON ({exc})") from exc
        if not isinstance(config, dict):
            raise CheckpointError(f"{cfg_file}: must hold a JSON object")
        fallback: dict = {}
        map_file = folder / "special_tokens_map.json"
        if map_file.is_file():
            try:
                fallback = json.loads(map_file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                fallback = {}
        tokens: dict[str, str] = {}
        ids: dict[str, int] = {}
        for role in SPECIAL_ROLES:
            text = _token_string(config.get(role)) or _token_string(fallback.get(role))
            if text is None:
                raise CheckpointError(f"{cfg_file}: no {role} is named; a laya row needs {', '.join(SPECIAL_ROLES)}")
            token_id = backend.token_to_id(text)
            if token_id is None:
                raise CheckpointError(f"{tok_file}: the {role} {text!r} is not in the vocabulary")
            tokens[role] = text
            ids[role] = token_id
        return cls(
            backend=backend,
            cls_token=tokens["cls_token"],
            sep_token=tokens["sep_token"],
            mask_token=tokens["mask_token"],
            pad_token=tokens["pad_token"],
            cls_id=ids["cls_token"],
            sep_id=ids["sep_token"],
            mask_id=ids["mask_token"],
            pad_id=ids["pad_token"],
            path=folder,
            # transformers (5) skips the clean-up on BPE models, where it would eat real spaces,
            # unless the config insists
            clean_up_spaces=config.get("clean_up_tokenization_spaces") is True and (
                type(backend.model).__name__ != "BPE"
                or config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output") is True),
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with no special tokens added (the row adds its own)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """Ids back to text as transformers' tokenizers decode them (special tokens kept, and the
        English punctuation spaces closed up when the config asks for it, as transformers 5 does): upstream scans a long
        state in windows of text decoded this way, so a window is the same tokens here."""
        text = self.backend.decode(list(ids), skip_special_tokens=False)
        if self.clean_up_spaces:
            for spaced, closed in CLEAN_UP:
                text = text.replace(spaced, closed)
        return text

    def sanitize(self, text: str) -> str:
        """Replace every literal mask-token string by a space, so text can never plant a marker."""
        return text.replace(self.mask_token, " ")
