"""`--decide-probe FILE`: a logit lens of every decision (seed 000's diagnostic), one JSON line each.

Per layer, the choice logits read from the last token's state at the end of that layer, put through
the model's final norm and the output rows of the choice tokens (read from the GGUF). For the last
token this is exact, not an estimate: its state after layer L depends on layers 0 to L only, so it
is what a prefill cut after layer L would answer; at the last layer it reproduces the answer's
logits to the device's rounding. It shows at which layer a decision settles.

The states are read through llama.cpp's graph callback (`cb_eval`) on a context of its own over the
same loaded weights: the probe prefills the decision's prompt again there, so it changes nothing the
serving context computes or keeps (its prefix cache included). Diagnostic: it doubles each decision's
prefill. Models whose final norm is an RMS norm (llama, qwen, gemma, ...) are read; others refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from laya.errors import CheckpointError

LAYER_OUTPUT = "l_out-"  # llama.cpp's name of a layer's output, `l_out-<layer>`
Q8_0_ACTIVATIONS = ("Q8_0", "Q4_0", "Q5_0", "IQ4_NL")  # head types whose CPU matmul reads Q8_0 activations
RMS_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "mistral", "gemma", "gemma2", "gemma3", "phi3",
             "granite", "olmo2", "smollm3")


class Lens:
    """Per-layer choice logits of a prompt over a `LlamaBackend`'s model."""

    def __init__(self, backend: Any):
        import gguf

        from laya.native.gguf_header import read_scalars

        meta = read_scalars(backend.path)
        arch = meta.get("general.architecture", "")
        if arch not in RMS_ARCHS:
            raise CheckpointError(f"{backend.path}: --decide-probe reads models with an RMS final norm "
                                  f"({', '.join(RMS_ARCHS)}), not {arch!r}")
        self.n_layer = int(meta[f"{arch}.block_count"])
        self.eps = float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6))
        tensors = {t.name: t for t in gguf.GGUFReader(str(backend.path)).tensors}
        self._norm = np.asarray(gguf.quants.dequantize(tensors["output_norm.weight"].data,
                                                       tensors["output_norm.weight"].tensor_type), dtype=np.float64)
        self._head = tensors.get("output.weight") or tensors["token_embd.weight"]
        self._rows: dict[int, np.ndarray] = {}
        self._backend = backend
        self._layers: dict[int, np.ndarray] = {}
        self._ctx = self._context()

    def _context(self) -> Any:
        lib, llama = self._backend._llama_cpp.llama_cpp._lib, self._backend._llama_cpp
        lib.ggml_get_name.restype, lib.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        lib.ggml_nelements.restype, lib.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
        lib.ggml_nrows.restype, lib.ggml_nrows.argtypes = ctypes.c_int64, [ctypes.c_void_p]
        lib.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
        lib.ggml_get_data_f32.argtypes = [ctypes.c_void_p]

        def seen(tensor, ask, _user) -> bool:
            try:
                name = (lib.ggml_get_name(tensor) or b"").decode("utf-8", "replace")
                if not name.startswith(LAYER_OUTPUT):
                    return not ask  # never asks for another tensor's data; always lets the graph go on
                if ask:
                    return True
                n, rows = lib.ggml_nelements(tensor), lib.ggml_nrows(tensor)
                width = n // max(1, rows)
                data = np.ctypeslib.as_array(lib.ggml_get_data_f32(tensor), shape=(n,))
                self._layers[int(name[len(LAYER_OUTPUT):])] = data[n - width:].astype(np.float64)
            except Exception:  # noqa: BLE001 - a callback must not raise into llama.cpp
                pass
            return True

        self._callback = llama.ggml_backend_sched_eval_callback(seen)  # kept: llama.cpp holds the pointer
        serving = self._backend.llm.context_params  # the serving context's own (attention kernels, batch, threads)
        params = type(serving).from_buffer_copy(serving)
        self._batch = int(serving.n_batch)  # its prefills are cut so, and the replay cuts them the same
        params.cb_eval = self._callback
        params.cb_eval_user_data = None
        ctx = llama.llama_init_from_model(self._backend.llm.model, params)
        if not ctx:
            raise CheckpointError(f"{self._backend.path}: llama.cpp could not open a context for --decide-probe")
        return ctx

    def _row(self, token: int) -> np.ndarray:
        if token not in self._rows:
            import gguf

            self._rows[token] = np.asarray(gguf.quants.dequantize(self._head.data[[token]], self._head.tensor_type),
                                           dtype=np.float64)[0]
        return self._rows[token]

    def _rounded(self, normed: np.ndarray) -> np.ndarray:
        """The final norm's output as the head's matmul reads it on the CPU: a quantised head takes its
        activations in 8-bit blocks (Q8_0), an f16 head in f16; where that is not emulated here
        (K-quants, Q4_1/Q5_1), unrounded (`head_rounding` says which)."""
        import gguf

        kind = gguf.GGMLQuantizationType(int(self._head.tensor_type))
        if kind.name in Q8_0_ACTIVATIONS:
            q8 = gguf.GGMLQuantizationType.Q8_0
            return np.asarray(gguf.quants.dequantize(gguf.quants.quantize(normed.astype(np.float32), q8), q8),
                              dtype=np.float64)
        if kind.name == "F16":
            return normed.astype(np.float16).astype(np.float64)
        return normed

    @property
    def head_rounding(self) -> str:
        import gguf

        name = gguf.GGMLQuantizationType(int(self._head.tensor_type)).name
        return "q8_0" if name in Q8_0_ACTIVATIONS else "f16" if name == "F16" else "none" if name == "F32" else (
            f"not emulated ({name})")

    def read(self, tokens: list[int], choices: list[list[int]], pieces: list[int] | None = None
             ) -> tuple[list[list[float]], list[float]]:
        """Per layer, each choice's logit (the log-sum-exp over its tokens: one token each but for the
        letters readout); and the same from the probe context's own last logits row. `pieces`: the
        prefills the serving context made (restored ones included), replayed as they were cut so
        that the last layer is that context's computation."""
        llama = self._backend._llama_cpp
        self._layers.clear()
        llama.llama_memory_clear(llama.llama_get_memory(self._ctx), True)
        at = 0
        for piece in [*(pieces or []), len(tokens) - sum(pieces or [])]:
            for start in range(at, at + piece, self._batch):
                chunk = tokens[start : min(start + self._batch, at + piece)]
                ids = (llama.llama_token * len(chunk))(*chunk)  # held: the batch only points at it
                batch = llama.llama_batch_get_one(ids, len(chunk))
                if (code := llama.llama_decode(self._ctx, batch)) != 0:
                    raise CheckpointError(f"--decide-probe: llama.cpp could not decode the prompt (code {code})")
            at += piece
        rows = {t: self._row(t) for ids in choices for t in ids}

        def logits(state: np.ndarray) -> list[float]:
            normed = state / np.sqrt(np.mean(state * state) + self.eps) * self._norm
            normed = self._rounded(normed)
            return [float(_logsumexp(np.array([rows[t] @ normed for t in ids]))) for ids in choices]

        lens = [logits(self._layers[layer]) for layer in sorted(self._layers)]
        ptr = llama.llama_get_logits_ith(self._ctx, -1)
        last = np.ctypeslib.as_array(ptr, shape=(self._backend.n_vocab,))
        final = [float(_logsumexp(np.array([float(last[t]) for t in ids]))) for ids in choices]
        return lens, final

    def close(self) -> None:
        if self._ctx:
            self._backend._llama_cpp.llama_free(self._ctx)
            self._ctx = None


def _logsumexp(values: np.ndarray) -> float:
    m = float(np.max(values))
    return m + float(np.log(np.exp(values - m).sum()))


class Probe:
    """Appends one JSON line per decision to a file (seed 000's fields: `seq`, `n_tokens`,
    `prefill_s`, the choices, `best`, `logp` and the `lens`)."""

    def __init__(self, backend: Any, path: str | os.PathLike, model: str = ""):
        self.lens = Lens(backend)
        self.model = model
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._seq = 0

    def record(self, qid: str, prompt: Any, labels: list[str], logp: np.ndarray, report: Any) -> dict[str, Any]:
        choices = [list(ids) for ids in prompt.letters] if prompt.letters is not None else [[seq[0]]
                                                                                              for seq in prompt.labels]
        started = time.perf_counter()
        lens, final = self.lens.read(prompt.tokens, choices, report.pieces[:-1])
        with self._lock:
            self._seq += 1
            line = {"seq": self._seq, "model": self.model, "question": qid, "n_tokens": len(prompt.tokens),
                    "prefill_s": report.prefill_ms / 1000.0, "head_rounding": self.lens.head_rounding,
                    "probe_s": time.perf_counter() - started, "choices": labels,
                    "best": labels[int(np.argmax(logp))], "logp": [float(v) for v in logp],
                    "final_logits": final, "lens": lens}
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
        return line
