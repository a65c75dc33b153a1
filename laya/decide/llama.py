"""The one adapter over a live llama.cpp context (llama-cpp-python), behind `DecideBackend`.

Logits are read with `llama_get_logits_ith(ctx, -1)`: with `logits_all=False`, `Llama.eval()` no
longer fills `Llama.scores`. States are saved and restored whole (`save_state`/`load_state`), so a
restored prefix continues exactly as the computed one would.

User text stays text: the chat template is rendered once around a placeholder message, and its
markup (before and after the message) is tokenised with special tokens parsed, the message itself
without. llama.cpp still matches user-defined tokens in plain text, so the message is also cut
inside every occurrence of a control or markup token's text before it is tokenised: no request
field can ever become a control token, whatever the template.

llama.cpp's backends are loaded, and its buffers chosen for this processor, by `laya.native.llama_cpp`.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from laya.errors import CheckpointError, RuntimeUnavailable
from laya.native.llama_cpp import load_backends, model_params_for_this_cpu

# The placeholder message the template is rendered around (private-use characters: no template or
# user text produces them by accident). Spaces around it reveal whether the template trims content.
PLACEHOLDER = "\ue000laya-user-message\ue001"
SYSTEM_PLACEHOLDER = "\ue000laya-system-turn\ue001"


def split_at_specials(text: str, specials: list[str]) -> list[str]:
    """`text` cut strictly inside every occurrence of each special token's text, so that no piece,
    tokenised on its own, can contain one."""
    cuts: set[int] = set()
    for special in specials:
        at = text.find(special)
        while at != -1:
            cuts.add(at + 1)
            at = text.find(special, at + 1)
    if not cuts:
        return [text]
    bounds = [0, *sorted(cuts), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


MAX_AUTO_KV_BYTES = 1 << 30  # the key/value cache a context sized by default may take
UNNAMED_CONTEXT = 4096  # the context of a GGUF that names none it was trained for
MIN_CONTEXT = 512


def auto_context(path: str | os.PathLike) -> int:
    """The context the model was trained for, as far as `MAX_AUTO_KV_BYTES` of f16 key/value cache
    holds it (llama.cpp allocates the whole cache up front)."""
    from laya.native.gguf_header import read_scalars

    meta = read_scalars(path)
    arch = meta.get("general.architecture", "")

    def number(key: str, default: int) -> int:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    trained = number("context_length", UNNAMED_CONTEXT)
    heads = number("attention.head_count", 1)
    head_dim = number("embedding_length", 0) // heads
    per_token = 2 * number("block_count", 0) * number("attention.head_count_kv", heads) * (
        number("attention.key_length", head_dim) + number("attention.value_length", head_dim))
    cap = MAX_AUTO_KV_BYTES // per_token if per_token > 0 else trained
    return max(MIN_CONTEXT, min(trained, cap))


class LlamaBackend:
    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | None = None, n_threads: int | None = None,
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
        self.cpu_module = load_backends(llama_cpp)
        # llama-cpp-python's default is half the cores; a decision is one prefill, so use them all
        n_threads = n_threads or os.cpu_count() or 1
        if n_ctx is None:
            n_ctx = auto_context(path)
        try:
            with model_params_for_this_cpu(llama_cpp):
                self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
                                           logits_all=False, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: llama.cpp cannot load this GGUF ({exc})") from exc
        self.path = path
        self.n_ctx = self.llm.n_ctx()
        self.n_vocab = self.llm.n_vocab()
        meta = self.llm.metadata or {}
        self.metadata = dict(meta)
        self.template = meta.get("tokenizer.chat_template")
        self.templated = bool(self.template)
        self._bos_text = self._token_text(self.llm.token_bos()) if self.llm.token_bos() >= 0 else ""
        self._eos_text = self._token_text(self.llm.token_eos()) if self.llm.token_eos() >= 0 else ""
        self._add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", "true") in ("true", True, "1"))
        self._specials = self._special_texts()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        ends = (self.llm.token_eos(), int(llama_cpp.llama_vocab_eot(vocab)))
        self.end_tokens = sorted({t for t in ends if 0 <= t < self.n_vocab})
        self._compiled = self._compile(self.template) if self.template else None
        self._markup = self._template_markup() if self._compiled else None
        self._chat_markup: tuple[str, str, str, bool] | None = None
        self._texts: list[str] | None = None

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

    def _special_texts(self) -> list[str]:
        """Texts of the control tokens, and of user-defined tokens that look like markup (`<...>`,
        `[...]`): the strings plain text must never turn into."""
        lib, model = self._llama_cpp, self.llm.model
        vocab = lib.llama_model_get_vocab(model)
        control = int(lib.LLAMA_TOKEN_ATTR_CONTROL)
        user_defined = int(lib.LLAMA_TOKEN_ATTR_USER_DEFINED)
        out = set()
        for token in range(self.n_vocab):
            attr = int(lib.llama_vocab_get_attr(vocab, token))
            if not attr & (control | user_defined):
                continue
            text = self._token_text(token)
            markup = len(text) >= 2 and text[0] + text[-1] in ("<>", "[]")
            if len(text) >= 2 and (attr & control or markup):
                out.add(text)
        return sorted(out)

    def _template_markup(self) -> tuple[str, str, bool]:
        """The template's text before and after the user's message, and whether it trims the message."""
        rendered = self._render([{"role": "user", "content": f" {PLACEHOLDER} "}])
        if rendered.count(PLACEHOLDER) != 1:
            raise CheckpointError(f"{self.path}: its chat template does not place the user's message verbatim once; "
                                  "laya cannot keep request text apart from the template's markup")
        before, _, after = rendered.partition(PLACEHOLDER)
        if before.endswith(" ") and after.startswith(" "):
            return before[:-1], after[1:], False
        return before.rstrip(" "), after.lstrip(" "), True

    def _render(self, messages: list[dict[str, str]]) -> str:
        assert self._compiled is not None, "a readout with a chat template"  # _template_markup's callers check
        return self._compiled.render(messages=messages, add_generation_prompt=True, bos_token=self._bos_text,
                                     eos_token=self._eos_text, enable_thinking=False)

    def _system_markup(self) -> tuple[str, str, str, bool]:
        """The template's text before the system turn, between it and the user's message, and after."""
        if self._chat_markup is None:
            if self._compiled is None:
                raise CheckpointError(f"{self.path}: has no chat template, so it has no system turn")
            try:
                rendered = self._render([{"role": "system", "content": f" {SYSTEM_PLACEHOLDER} "},
                                         {"role": "user", "content": f" {PLACEHOLDER} "}])
            except Exception as exc:  # noqa: BLE001 - a template may refuse a system turn outright
                raise CheckpointError(f"{self.path}: its chat template takes no system turn ({exc})") from exc
            if rendered.count(SYSTEM_PLACEHOLDER) != 1 or rendered.count(PLACEHOLDER) != 1 \
                    or rendered.index(SYSTEM_PLACEHOLDER) > rendered.index(PLACEHOLDER):
                raise CheckpointError(f"{self.path}: its chat template does not place a system turn and the user's "
                                      "message verbatim once each, in that order")
            before, _, rest = rendered.partition(SYSTEM_PLACEHOLDER)
            between, _, after = rest.partition(PLACEHOLDER)
            trims = not (before.endswith(" ") and between.startswith(" ") and between.endswith(" ")
                         and after.startswith(" "))
            if trims:
                before, between, after = before.rstrip(" "), between.strip(" "), after.lstrip(" ")
            else:
                before, between, after = before[:-1], between[1:-1], after[1:]
            self._chat_markup = (before, between, after, trims)
        return self._chat_markup

    def _markup_tokens(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) if text else []

    def _opening(self, before: str) -> list[int]:
        """BOS, unless the template writes it itself."""
        if self._add_bos and not (self._bos_text and before.startswith(self._bos_text)):
            return [self.llm.token_bos()]
        return []

    def prompt_tokens(self, message: str) -> list[int]:
        before, after, trims = self._markup or ("", "", False)
        text = message.strip() if trims else message
        return self._opening(before) + self._markup_tokens(before) + self.tokenize(text) + self._markup_tokens(after)

    def chat_tokens(self, system: str, user: str, assistant: str = "") -> tuple[list[int], int]:
        before, between, after, trims = self._system_markup()
        head = (self._opening(before) + self._markup_tokens(before) + self.tokenize(system.strip() if trims else system)
                + self._markup_tokens(between))
        return head + self.tokenize(user.strip() if trims else user) + self._markup_tokens(after + assistant), len(head)

    def token_texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [self.llm.detokenize([t], special=False).decode("utf-8", errors="replace")
                           for t in range(self.n_vocab)]
        return self._texts

    def tokenize(self, text: str) -> list[int]:
        tokens: list[int] = []
        for piece in split_at_specials(text, self._specials):
            tokens += self.llm.tokenize(piece.encode("utf-8"), add_bos=False, special=False)
        return tokens

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


def open_gguf(source: str | os.PathLike, *, name: str | None = None, n_ctx: int | None = None,
              threads: int | None = None, prefix_cache: str = "auto", calibration: str | os.PathLike | None = None,
              readout: str | None = None, decide_probe: str | os.PathLike | None = None):
    """A `DecideModel` over a chat GGUF file (the one way `laya serve` and `laya calibrate` open one),
    read by `readout` or by the profile its metadata names (`laya.decide.metadata`); `decide_probe`:
    the file its decisions' logit lens is appended to (`laya.decide.lens`)."""
    from laya.decide.metadata import choose_readout, profile_name
    from laya.decide.model import DecideModel, DecideSettings
    from laya.decide.policy import PrefixCache

    if readout is not None:
        profile_name(readout, "--readout")  # a bad name is refused before the model loads
    fitted = None
    if calibration is not None:
        from laya.calibration.file import load_calibration

        fitted = load_calibration(calibration)
        if fitted.whole is not None:
            raise CheckpointError(f"{calibration}: an upstream laya calibration file is fitted on a laya checkpoint; "
                                  "calibrate a GGUF with `laya calibrate` (its own format)")
    cache = PrefixCache(policy=prefix_cache)  # checks the policy name before the model loads
    backend = LlamaBackend(source, n_ctx=n_ctx, n_threads=threads)
    choice = choose_readout(source, backend.metadata, readout)
    settings = DecideSettings(readout=choice.name, readout_from=choice.source,
                              temperature_from_model=choice.temperatures is not None)
    if choice.temperatures is not None:
        settings.temperature = dict(choice.temperatures)
    model = DecideModel(backend, name or Path(source).stem.lower(), cache=cache, source=os.fspath(source),
                        calibration=fitted, settings=settings)
    if decide_probe is not None:
        from laya.decide.lens import Probe

        model.probe = Probe(backend, decide_probe, model.name)
    return model
