"""The one adapter over a live llama.cpp context (llama-cpp-python), behind `DecideBackend`.

Logits are read with `llama_get_logits_ith(ctx, -1)`: with `logits_all=False`, `Llama.eval()` no
longer fills `Llama.scores`. States are saved and restored whole (`save_state`/`load_state`), so a
restored prefix continues exactly as the computed one would.

User text stays text: the chat template is rendered once around a placeholder message, and its
markup (before and after the message) is tokenised with special tokens parsed, the message itself
without. llama.cpp still matches user-defined tokens in plain text, so the message is also cut
inside every occurrence of a control or markup token's text before it is tokenised: no request
field can ever become a control token, whatever the template.

A llama.cpp built with runtime CPU dispatch (`GGML_BACKEND_DL`, `GGML_CPU_ALL_VARIANTS`: see
scripts/setup.sh) has no CPU kernels linked in: they are `libggml-cpu-<variant>.so` modules in
llama-cpp-python's `lib` folder, and `load_backends` has ggml load the one that scores best on this
processor before the first model is loaded (llama.cpp itself would only look next to the Python
executable and in the working directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from laya.errors import CheckpointError, RuntimeUnavailable

# The placeholder message the template is rendered around (private-use characters: no template or
# user text produces them by accident). Spaces around it reveal whether the template trims content.
PLACEHOLDER = "\ue000laya-user-message\ue001"


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


def load_backends(llama_cpp) -> str | None:
    """Load llama.cpp's backends from llama-cpp-python's `lib` folder when none is loaded yet, so a
    runtime-dispatch build gets the CPU variant that scores best here. A no-op on a build with its
    CPU backend linked in (that one counts as loaded). Returns the CPU module loaded, if one is
    (`None` on a build with the CPU backend linked in, or off Linux)."""
    lib = llama_cpp.llama_cpp._lib  # libllama: the ggml symbols resolve through its dependencies
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_count.argtypes = []
    if lib.ggml_backend_reg_count() == 0:
        lib.ggml_backend_load_all_from_path.restype = None
        lib.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        # ggml reports each module it loads through llama-cpp-python's log, which prints to stderr
        # unless its logger's level says otherwise (as Llama(verbose=False) sets it afterwards)
        log = logging.getLogger("llama-cpp-python")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            lib.ggml_backend_load_all_from_path(os.fsencode(llama_cpp.llama_cpp._base_path))
        finally:
            log.setLevel(level)
        if lib.ggml_backend_reg_count() == 0:
            raise RuntimeUnavailable(f"llama.cpp found no backend it can run in {llama_cpp.llama_cpp._base_path} "
                                     "(no libggml-cpu-*.so supports this processor)")
    return loaded_cpu_module()


def extra_buffers_allowed() -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (AMX, repacked layouts).

    Not on a processor with AMX unless LAYA_LLAMA_AMX=1: ggml's AMX matmuls (used for quantised weights
    in its AMX buffers) died with an illegal instruction on an AMX Xeon here (`tileloadd` with no tile
    configuration loaded), in the decide engine (SmolLM2's Q4_1) and in the encoder (Q8_0), while AMX
    itself worked in a test program. Without the extra buffers such a machine runs the AVX-512 kernels,
    as every processor without AMX does."""
    if os.environ.get("LAYA_LLAMA_AMX") == "1":
        return True
    from laya.hardware import cpu

    return not ({"amx_int8", "amx_tile", "amx_bf16"} & cpu().flags)


@contextlib.contextmanager
def model_params_for_this_cpu(llama_cpp) -> Iterator[None]:
    """llama-cpp-python's `Llama` takes no `use_extra_bufts`: while it loads a model, its default model
    parameters say what `extra_buffers_allowed` says."""
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params
    if extra_buffers_allowed():
        yield
        return

    def defaults():
        params = original()
        params.use_extra_bufts = False
        return params

    module.llama_model_default_params = defaults
    try:
        yield
    finally:
        module.llama_model_default_params = original


def loaded_cpu_module() -> str | None:
    """The `libggml-cpu-<variant>` module mapped into this process (Linux), or `None`."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split()[-1] for line in maps if "/libggml-cpu-" in line}
    except OSError:
        return None
    return Path(sorted(found)[0]).name if found else None


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
        self.cpu_module = load_backends(llama_cpp)
        # llama-cpp-python's default is half the cores; a decision is one prefill, so use them all
        n_threads = n_threads or os.cpu_count() or 1
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
        self.template = meta.get("tokenizer.chat_template")
        self.templated = bool(self.template)
        self._bos_text = self._token_text(self.llm.token_bos()) if self.llm.token_bos() >= 0 else ""
        self._eos_text = self._token_text(self.llm.token_eos()) if self.llm.token_eos() >= 0 else ""
        self._add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", "true") in ("true", True, "1"))
        self._specials = self._special_texts()
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        ends = (self.llm.token_eos(), int(llama_cpp.llama_vocab_eot(vocab)))
        self.end_tokens = sorted({t for t in ends if 0 <= t < self.n_vocab})
        self._markup = self._template_markup(self._compile(self.template)) if self.template else None

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

    def _template_markup(self, template) -> tuple[str, str, bool]:
        """The template's text before and after the user's message, and whether it trims the message."""
        rendered = template.render(messages=[{"role": "user", "content": f" {PLACEHOLDER} "}],
                                   add_generation_prompt=True, bos_token=self._bos_text, eos_token=self._eos_text,
                                   enable_thinking=False)
        if rendered.count(PLACEHOLDER) != 1:
            raise CheckpointError(f"{self.path}: its chat template does not place the user's message verbatim once; "
                                  "laya cannot keep request text apart from the template's markup")
        before, _, after = rendered.partition(PLACEHOLDER)
        if before.endswith(" ") and after.startswith(" "):
            return before[:-1], after[1:], False
        return before.rstrip(" "), after.lstrip(" "), True

    def prompt_tokens(self, message: str) -> list[int]:
        before, after, trims = self._markup or ("", "", False)
        tokens = []
        if self._add_bos and not (self._bos_text and before.startswith(self._bos_text)):
            tokens.append(self.llm.token_bos())
        if before:
            tokens += self.llm.tokenize(before.encode("utf-8"), add_bos=False, special=True)
        tokens += self.tokenize(message.strip() if trims else message)
        if after:
            tokens += self.llm.tokenize(after.encode("utf-8"), add_bos=False, special=True)
        return tokens

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


def open_gguf(source: str | os.PathLike, *, name: str | None = None, n_ctx: int = 4096,
              threads: int | None = None, prefix_cache: str = "auto", calibration: str | os.PathLike | None = None):
    """A `DecideModel` over a chat GGUF file (the one way `laya serve` and `laya calibrate` open one)."""
    from laya.decide.model import DecideModel
    from laya.decide.policy import PrefixCache

    fitted = None
    if calibration is not None:
        from laya.calibration.file import load_calibration

        fitted = load_calibration(calibration)
        if fitted.whole is not None:
            raise CheckpointError(f"{calibration}: an upstream laya calibration file is fitted on a laya checkpoint; "
                                  "calibrate a GGUF with `laya calibrate` (its own format)")
    cache = PrefixCache(policy=prefix_cache)  # checks the policy name before the model loads
    backend = LlamaBackend(source, n_ctx=n_ctx, n_threads=threads)
    return DecideModel(backend, name or Path(source).stem.lower(), cache=cache, source=os.fspath(source),
                       calibration=fitted)
