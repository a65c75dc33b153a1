"""The one adapter over a live llama.cpp context (llama-cpp-python), behind `DecideBackend`.

Logits are read with `llama_get_logits_ith(ctx, -1)`: with `logits_all=False`, `Llama.eval()` no
longer fills `Llama.scores`. States are saved and restored whole (`save_state`/`load_state`), so a
restored prefix continues exactly as the computed one would.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from laya.errors import CheckpointError, RuntimeUnavailable


class LlamaBackend:
    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512):
        try:
            import llama_cpp
        except ImportError as exc:
            raise RuntimeUnavailable(
                "the decide engine needs llama-cpp-python: pip install 'laya-runtime[llama]'") from exc
        path = Path(model_path)
        if not path.is_file():
            raise CheckpointError(f"{path}: GGUF file not found")
        self._llama_cpp = llama_cpp
        # llama-cpp-python's default is half the cores; a decision is one prefill, so use them all
        n_threads = n_threads or os.cpu_count() or 1
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                       logits_all=False, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: llama.cpp cannot load this GGUF ({exc})") from exc
        self.path = path
        self.n_ctx = self.llm.n_ctx()
        self.n_vocab = self.llm.n_vocab()
        meta = self.llm.metadata or {}
        self.template = meta.get("tokenizer.chat_template")
        self.templated = bool(self.template)
        self._bos_text = self._token_text(self.llm.token_bos()) if self.llm.token_bos() >= 0 else ""
        self._eos_text = self._token_text(self.llm.token_eos()) if self.llm.token_eos() >= 0 else ""
        self._add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", "true") in ("true", True, "1"))
        self._render = self._compile(self.template) if self.template else None

    def _token_text(self, token: int) -> str:
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    @staticmethod
    def _compile(template: str):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise ValueError(message)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(template)

    def render(self, message: str) -> str:
        if self._render is None:
            return message
        return self._render.render(messages=[{"role": "user", "content": message}], add_generation_prompt=True,
                                   bos_token=self._bos_text, eos_token=self._eos_text, enable_thinking=False)

    def tokenize(self, text: str, *, prompt: bool) -> list[int]:
        if not prompt:
            return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        add_bos = self._add_bos and not (self._bos_text and text.startswith(self._bos_text))
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def reset(self) -> None:
        self.llm.reset()

    def prefill(self, tokens: list[int]) -> None:
        self.llm.eval(tokens)

    def last_logits(self) -> np.ndarray:
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,)).copy()

    def save_state(self) -> Any:
        return self.llm.save_state()

    def load_state(self, state: Any) -> None:
        self.llm.load_state(state)

    def state_nbytes(self, state: Any) -> int:
        return int(state.llama_state_size) + int(getattr(state, "input_ids", np.empty(0)).nbytes)

    def describe(self) -> dict[str, Any]:
        return {"gguf": str(self.path), "n_ctx": self.n_ctx, "n_vocab": self.n_vocab, "templated": self.templated,
                "threads": self.llm.n_threads if hasattr(self.llm, "n_threads") else None}


def open_gguf(source: str | os.PathLike, *, name: str | None = None, n_ctx: int = 4096,
              threads: int | None = None, prefix_cache: str = "auto", calibration: str | os.PathLike | None = None):
    """A `DecideModel` over a chat GGUF file (the one way `laya serve` and `laya calibrate` open one)."""
    from laya.decide.model import DecideModel
    from laya.decide.policy import PrefixCache

    fitted = None
    if calibration is not None:
        from laya.calibration.file import load_calibration

        fitted = load_calibration(calibration)
    cache = PrefixCache(policy=prefix_cache)  # checks the policy name before the model loads
    backend = LlamaBackend(source, n_ctx=n_ctx, n_threads=threads)
    return DecideModel(backend, name or Path(source).stem.lower(), cache=cache, source=os.fspath(source),
                       calibration=fitted)
