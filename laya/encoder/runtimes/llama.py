"""`runtime="llama"`: the encoder on llama.cpp (a GGUF run as `modern-bert`), the head on the client.

It runs a llama bundle (`laya export gguf`, or what `laya.load(..., runtime="llama")` exports on first
use): llama.cpp encodes each row non-causally with no pooling and every token's state is read back;
the decision head, scorer and act head run here in numpy fp32 (`laya.encoder.numpy_head`).

Rows go to llama.cpp unpadded, each as a sequence of its own (positions from 0) and several in one
`llama_encode` call: a call's attention is one [tokens x tokens] product masked by sequence, so a call
holds at most `CALL_TOKENS` tokens (or one row, if longer) to keep that waste small. The context is
sized by the longest call seen and grows when a longer one comes. llama.cpp aborts the process on an
over-full batch instead of returning an error, so every limit is checked here first.

A reduced type (f16, q8_0) was gated at export against fp32 and is refused, unless forced, when its
gate failed. A row's answer moves a little with what shares its call (kernels sum in another order);
the gate bounds that, and q8_0, where it was 0.03 on the mmBERT-base shape against a bound of 0.01,
runs each row in a call of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from laya.encoder.batch import Batch
from laya.encoder.bundle import ARCH, finish, open_bundle
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.gate import GateFailed
from laya.encoder.numpy_head import NumpyHead
from laya.encoder.runtimes.base import RuntimeBase
from laya.errors import CheckpointError, RuntimeUnavailable

PRECISIONS = ("f32", "f16", "q8_0")
CALL_TOKENS = 512  # tokens per llama_encode call (a longer row goes alone)
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ: sequences in one context
CONTEXT_STEP = 256


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:
        raise RuntimeUnavailable("the llama runtime needs llama-cpp-python: pip install 'laya-runtime[llama]'") from exc
    return llama_cpp


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """llama.cpp's load report off stderr. llama-cpp-python maps ggml's warning level to logging's ERROR
    (its table predates ggml's DEBUG level), so only CRITICAL keeps the expected "adding N dummy tokens"
    (no vocabulary in the file: laya tokenises) from printing at every load."""
    log = logging.getLogger("llama-cpp-python")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


class LlamaEncoder:
    """One GGUF encoder in llama.cpp and the context its calls run in."""

    def __init__(self, path: Path, threads: int | None = None):
        from laya.native.llama_cpp import extra_buffers_allowed, load_backends

        llama_cpp = self._lib = _llama_cpp()
        self.cpu_module = load_backends(llama_cpp)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.use_extra_bufts = extra_buffers_allowed()
        with _quiet():
            self.model = llama_cpp.llama_model_load_from_file(os.fsencode(path), params)
        if not self.model:
            raise CheckpointError(f"{path}: llama.cpp cannot load this GGUF encoder (a modern-bert GGUF written by "
                                  "`laya export gguf` is expected)")
        self.path = path
        self.d = int(llama_cpp.llama_model_n_embd(self.model))
        self.threads = int(threads or os.cpu_count() or 1)
        self.ctx = None
        self.capacity = 0
        self._seq_values = np.arange(MAX_SEQ, dtype=np.int32)
        self._seq_addresses = self._seq_values.ctypes.data + 4 * np.arange(MAX_SEQ, dtype=np.uint64)

    def _context(self, tokens: int) -> Any:
        """A context whose calls hold `tokens` (grown, never shrunk: creating one reserves its buffers)."""
        if tokens <= self.capacity and self.ctx is not None:
            return self.ctx
        lib = self._lib
        capacity = -(-max(tokens, CALL_TOKENS) // CONTEXT_STEP) * CONTEXT_STEP
        if self.ctx is not None:
            with _quiet():
                lib.llama_free(self.ctx)
            self.ctx = None
        cp = lib.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = capacity
        cp.n_seq_max = min(MAX_SEQ, capacity)
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.embeddings = True
        cp.pooling_type = lib.LLAMA_POOLING_TYPE_NONE
        cp.attention_type = lib.LLAMA_ATTENTION_TYPE_NON_CAUSAL
        cp.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # on: f16 K and V, 3.7e-3 off
        cp.kv_unified = True
        with _quiet():
            ctx = lib.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeUnavailable(f"{self.path}: llama.cpp could not create a context of {capacity} tokens")
        self.ctx, self.capacity = ctx, capacity
        return ctx

    def encode(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """Each row's token states [n, d] fp32, the rows packed into calls of at most CALL_TOKENS."""
        out: list[np.ndarray] = []
        call: list[np.ndarray] = []
        size = 0
        for ids in rows:
            if call and (size + len(ids) > CALL_TOKENS or len(call) == MAX_SEQ):
                out += self._call(call)
                call, size = [], 0
            call.append(ids)
            size += len(ids)
        if call:
            out += self._call(call)
        return out

    def _call(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        lib = self._lib
        lengths = [len(r) for r in rows]
        n = sum(lengths)
        ctx = self._context(n)
        if n > self.capacity or len(rows) > min(MAX_SEQ, self.capacity) or min(lengths) < 1:
            raise RuntimeUnavailable(f"a call of {len(rows)} rows and {n} tokens does not fit the llama context")
        token = np.concatenate(rows).astype(np.int32)
        pos = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
        seq = np.repeat(np.arange(len(rows)), lengths)
        n_seq_id = np.ones(n, dtype=np.int32)
        seq_ptrs = self._seq_addresses[seq]  # each token's seq_id list: one id, pointing into _seq_values
        outputs = np.ones(n, dtype=np.int8)
        batch = lib.llama_batch()
        batch.n_tokens = n
        batch.token = token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.embd = None
        batch.pos = pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(seq_ptrs.ctypes.data, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        batch.logits = outputs.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        status = lib.llama_encode(ctx, batch)
        if status != 0:
            raise RuntimeUnavailable(f"llama.cpp failed to encode {len(rows)} rows of {n} tokens (status {status})")
        states = np.ctypeslib.as_array(lib.llama_get_embeddings(ctx), shape=(n, self.d)).copy()
        bounds = np.cumsum([0, *lengths])
        return [states[a:b] for a, b in zip(bounds, bounds[1:])]

    def close(self) -> None:
        with _quiet():
            if self.ctx is not None:
                self._lib.llama_free(self.ctx)
                self.ctx = None
            if self.model is not None:
                self._lib.llama_model_free(self.model)
                self.model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the library may be gone already
            self.close()


PROBE_D = 64  # the probe encoder: d = I = 64, one head, one layer whose output is its GeGLU
PROBE_SCALES = np.linspace(-4.0, 4.0, PROBE_D)  # GELU inputs where the 16-bit table is off by up to 2e-3
GELU_TOLERANCE = 1e-4


def probe_weights() -> dict[str, np.ndarray]:
    """An encoder whose output is GeGLU's GELU of known inputs: attention zeroed, every norm's weight
    one, a token embedding of alternating +-1 (mean 0, variance 1: the norms keep it), `ffn_up` making
    GELU inputs PROBE_SCALES and gates of 1, `ffn_down` the identity."""
    d = PROBE_D
    e = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    up = np.concatenate([PROBE_SCALES[:, None] * e[None, :] / d, np.tile(e / d, (d, 1))])
    ones = np.ones(d)
    return {"token_embd.weight": np.tile(e, (4, 1)), "token_embd_norm.weight": ones,
            "blk.0.attn_qkv.weight": np.zeros((3 * d, d)), "blk.0.attn_output.weight": np.zeros((d, d)),
            "blk.0.ffn_norm.weight": ones, "blk.0.ffn_up.weight": up, "blk.0.ffn_down.weight": np.eye(d),
            "output_norm.weight": ones}


def probe_reference(weights: dict[str, np.ndarray], eps: float = 1e-5) -> np.ndarray:
    """The probe encoder's output for one token, in float64 with the exact GELU."""
    from laya.encoder.numpy_head import erfc

    def norm(x):
        c = x - x.mean()
        return c / np.sqrt((c * c).mean() + eps)

    x0 = norm(weights["token_embd.weight"][0])
    a = weights["blk.0.ffn_up.weight"] @ norm(x0)
    gate_in, gate = a[:PROBE_D], a[PROBE_D:]
    y = 0.5 * gate_in * erfc(-gate_in / np.sqrt(2.0)) * gate
    return norm(x0 + weights["blk.0.ffn_down.weight"] @ y)


def gelu_error(states: np.ndarray) -> float:
    """How far an engine's probe output is from the exact-GELU reference."""
    return float(np.max(np.abs(states - probe_reference(probe_weights())[None, :])))


@functools.cache
def llama_gelu_error() -> float:
    """How far this llama.cpp's modern-bert GeGLU is from the exact GELU, measured once per process on
    the probe encoder: ~1e-7 with scripts/llama-modern-bert.patch, ~1e-3 on stock llama.cpp (a 16-bit
    table of the tanh approximation), which would put f32 answers 1e-3 off the reference."""
    import tempfile

    import gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.gguf"
        writer = gguf.GGUFWriter(str(path), ARCH)
        for key, value in (("context_length", 64), ("embedding_length", PROBE_D), ("block_count", 1),
                           ("feed_forward_length", PROBE_D), ("attention.head_count", 1), ("vocab_size", 4),
                           ("pooling_type", 0)):
            writer.add_uint32(f"modern-bert.{key}", value)
        writer.add_float32("modern-bert.attention.layer_norm_epsilon", 1e-5)
        writer.add_bool("modern-bert.attention.causal", False)
        writer.add_string("tokenizer.ggml.model", "none")
        for name, tensor in probe_weights().items():
            writer.add_tensor(name, tensor.astype(np.float32))
        finish(writer)
        encoder = LlamaEncoder(path, threads=1)
        try:
            states = encoder.encode([np.arange(4, dtype=np.int64)])[0]
        finally:
            encoder.close()
    return gelu_error(states)


class LlamaRuntime(RuntimeBase):
    name = "llama"

    def __init__(self, checkpoint: Checkpoint, precision: str = "f32", threads: int | None = None,
                 force: bool = False, bundle: str | Path | None = None):
        if precision not in PRECISIONS:
            raise CheckpointError(f"llama precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        folder, manifest = open_bundle(checkpoint, bundle, "llama", "f32", force=force, export="gguf")
        self._open(folder, manifest, threads)
        if self.precision == "f32":
            error = llama_gelu_error()
            if error > GELU_TOLERANCE:
                self.gate: dict[str, Any] | None = {
                    "precision": "f32", "rows": 0, "max_dp": round(error, 6), "argmax_agreement": 1.0,
                    "batch_dependence_max_dp": 0.0, "passed": False, "probe": "exact GELU (hidden states)",
                    "bounds": {"max_dp": GELU_TOLERANCE, "argmax_agreement": 1.0, "batch_dependence_max_dp": 0.0}}
                if not force:
                    raise GateFailed(
                        f"this llama.cpp computes ModernBERT's GELU from a 16-bit table ({error:.1e} off the exact "
                        "GELU on a probe), so f32 answers would drift about 1e-3 from the reference; build "
                        "llama-cpp-python with scripts/llama-modern-bert.patch (scripts/setup.sh does), or pass "
                        "force=True to accept it", self.gate)

    @classmethod
    def from_folder(cls, folder: Path, manifest: dict[str, Any], threads: int | None = None) -> LlamaRuntime:
        """A runtime over a bundle being written (the exporter's gate runs it before the manifest exists)."""
        runtime = cls.__new__(cls)
        runtime._open(folder, manifest, threads)
        return runtime

    def _open(self, folder: Path, manifest: dict[str, Any], threads: int | None) -> None:
        from safetensors.numpy import load_file

        self.folder, self.manifest = folder, manifest
        self.precision = manifest["precision"]
        self.gate = manifest.get("gate")
        tensors = load_file(str(folder / manifest.get("head", "head.safetensors")))
        layers = sum(1 for k in tensors if k.startswith("head.layers.") and k.endswith(".norm1.weight"))
        self.head = NumpyHead(tensors, layers)
        self.encoder = LlamaEncoder(folder / manifest.get("encoder", "encoder.gguf"), threads)

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        lengths = batch.attention_mask.sum(1)
        rows = [batch.input_ids[i, : int(n)] for i, n in enumerate(lengths)]
        if self.precision == "q8_0":  # each row its own call: rounded activations carry a call's company further
            states = [s for row in rows for s in self.encoder.encode([row])]
        else:
            states = self.encoder.encode(rows)
        return batch.per_row(lambda i, n, k: self.head.row(states[i], batch.marker_pos[i, :k], int(batch.qtype[i])))

    def close(self) -> None:
        self.encoder.close()
