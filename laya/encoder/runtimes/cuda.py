"""`runtime="cuda"`: the decision network on an NVIDIA GPU, rows padded to a few shapes, each replayed
as a CUDA graph.

On a GPU a small batch costs its kernel launches more than its arithmetic (a 22-layer encoder is some
400 kernels), so every shape a server meets is captured once as a `torch.cuda.CUDAGraph` at warm-up and
replayed per request: one host-to-device copy in, one replay, one copy out. The shapes are buckets
(`buckets.py`): token lengths rounded up to 16 up to 256, then to 64 up to `max_len`; row counts to a
power of two up to `max_rows`. A batch is packed into one pass per token bucket; padded tokens are
masked in every attention (`RowNet`'s `keep`: keys masked, padded queries see every valid key) and
padded rows (copies of a real row, so every number stays finite) are discarded. Option markers use a
fixed number of slots (`MARKER_SLOTS`, masked past a row's options); a batch with more options than
slots runs eagerly at its own count, never capturing on a request path.

The network is `rownet.RowNet` (encoder from gathered embeddings, decision head, scorer, act head) on the
device; tokenising and building rows stay on the CPU. Precisions:

- `fp32`: exact, within 1e-4 of the reference runtime; TF32 is turned off for matrix products and
  cuDNN in this process (it keeps 10-bit fractions and would move answers by ~1e-3);
- `bf16` (compute capability 8.0 and later) and `fp16`: the encoder's projections, attention and the
  head's projections reduced, the residual stream, norms, RoPE, the scorer and the act head in fp32.
  Each answers only within the precision standard (`laya.encoder.gate`) on the checkpoint at hand: the
  gate tries every encoder layer reduced, then the first kept in fp32, on the eager network on the same
  device (a graph replays the same kernels), against fp32 on that device; the record is cached per
  checkpoint, device and torch version.

`device="cpu"` runs the very same code on the CPU, the graphs replaced by eager calls through the same
bucket cache: how the tests and CI check it without a GPU.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from laya.encoder.batch import Batch
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.gate import cached_gate, measure
from laya.encoder.head_layout import MASKED_LOGIT
from laya.encoder.runtimes.base import RuntimeBase
from laya.encoder.runtimes.buckets import DEFAULT_MAX_ROWS, GraphCache, Key, Pass, all_buckets, pack
from laya.encoder.runtimes.rownet import EMBEDDINGS, Plan, RowNet, first_passing_plan, tried_plans
from laya.errors import RuntimeUnavailable

# Bumped whenever the network, its plans or the packing change, so that cached gate records are remade.
REVISION = 1
PRECISIONS = ("fp32", "bf16", "fp16")
FP32_LAYER_TIERS = (0, 1)  # encoder layers kept in fp32, tried in this order by the gate
MARKER_SLOTS = 32  # option slots of a captured bucket: choices of up to 32 options (tournaments play 16)


def exact_fp32() -> None:
    """fp32 products in fp32: TF32 (on by default for cuDNN, and wherever a caller set it) rounds their
    inputs to 10-bit fractions, beyond the 1e-4 an fp32 runtime promises. Process-wide, as torch has it."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def resolve_device(device: str | None) -> torch.device:
    """The device to run on: None means "cuda", refused with the reason where torch sees no GPU."""
    name = "cuda" if device is None else str(device)
    try:
        found = torch.device(name)
    except RuntimeError as exc:
        raise RuntimeUnavailable(f"runtime 'cuda': {name!r} is not a device ({exc}); use 'cuda', 'cuda:N' or "
                                 "'cpu'") from exc
    if found.type == "cpu":
        return found
    if found.type != "cuda":
        raise RuntimeUnavailable(f"runtime 'cuda' runs on a CUDA device (or device='cpu' for tests), not {name!r}")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise RuntimeUnavailable(f"runtime 'cuda' needs an NVIDIA GPU that torch can use, and torch "
                                 f"{torch.__version__} ({build}) sees none here (torch.cuda.is_available() is "
                                 "False). Use runtime='auto' (or 'packed') on this machine, or device='cpu' to "
                                 "run the same code on the CPU")
    if found.index is not None and found.index >= torch.cuda.device_count():
        raise RuntimeUnavailable(f"runtime 'cuda': {name} does not exist ({torch.cuda.device_count()} visible)")
    return found if found.index is not None else torch.device("cuda", torch.cuda.current_device())


def precision_refusal(precision: str, device: torch.device) -> str | None:
    """Why `precision` would be emulated (slow) on this GPU, or None. The CPU device runs every precision:
    it exists to check the code, not to be fast."""
    if device.type != "cuda" or precision == "fp32":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    need = {"bf16": (8, "Ampere"), "fp16": (7, "Volta")}[precision]
    if major < need[0]:
        return (f"this GPU (compute capability {major}.{minor}) has no {precision} tensor cores ({need[1]}, "
                f"{need[0]}.0, or later)")
    return None


def plans(precision: str) -> list[Plan]:
    """The plans a precision's gate tries, in order."""
    return tried_plans(precision, precision, FP32_LAYER_TIERS)


def device_label(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def write_inputs(out: np.ndarray, batch: Batch, members: tuple[int, ...], tokens: int, slots: int) -> None:
    """One pass's inputs in one int64 array [rows, 2 tokens + 2 slots + 1] (a single copy to the device):
    token ids, the keep mask, marker positions, the marker mask, the question type. Rows past `members`
    repeat the first member (finite numbers, discarded); tokens past a row's length are not kept."""
    out[...] = 0
    src = list(members) + [members[0]] * (out.shape[0] - len(members))
    n, k = min(tokens, batch.length), min(slots, batch.n_markers)
    out[:, :n] = batch.input_ids[src, :n]
    out[:, tokens : tokens + n] = batch.attention_mask[src, :n]
    out[:, 2 * tokens : 2 * tokens + k] = batch.marker_pos[src, :k]
    out[:, 2 * tokens + slots : 2 * tokens + slots + k] = batch.marker_mask[src, :k]
    out[:, -1] = batch.qtype[src]


@dataclass
class Buffers:
    """A bucket's static inputs: on the host (pinned on a GPU, where the next pass is written) and on the
    device (what the captured graph reads); the same tensor on the CPU."""

    host: torch.Tensor
    device: torch.Tensor


class BucketRunner:
    """`forward(batch)` of one network on one device: the batch packed into bucket passes, each through
    its bucket's captured graph (`graphs`), or the same function called eagerly."""

    def __init__(self, net: RowNet, embeddings: torch.Tensor, n_act: int, max_rows: int, max_len: int,
                 graphs: bool, slots: int = MARKER_SLOTS):
        self.net, self.embeddings, self.n_act = net, embeddings, n_act
        self.device = embeddings.device
        self.max_rows, self.max_len, self.slots, self.graphs = max_rows, max_len, slots, graphs
        self.pool = torch.cuda.graph_pool_handle() if graphs else None  # one pool: passes never overlap
        self.cache: GraphCache[Buffers, torch.Tensor] = GraphCache(
            self._allocate, self._capture if graphs else self._eager)

    def step(self, x: torch.Tensor, slots: int) -> torch.Tensor:
        """What a graph captures: packed inputs [R, 2T + 2S + 1] -> option logits and act logits [R, S + n_act]."""
        t = (x.shape[1] - 2 * slots - 1) // 2
        ids, keep, pos, mask, qtype = x.split([t, t, slots, slots, 1], 1)
        emb = F.embedding(ids, self.embeddings).float()
        logits, act = self.net(emb, keep.bool(), pos, mask.bool(), qtype[:, 0])
        return torch.cat([logits, act.float()], 1)

    def _allocate(self, key: Key) -> Buffers:
        rows, tokens = key
        host = torch.zeros(rows, 2 * tokens + 2 * self.slots + 1, dtype=torch.int64,
                           pin_memory=self.device.type == "cuda")
        host[:, tokens : 2 * tokens] = 1  # a capture's warm-up runs on finite numbers: every token kept
        host[:, 2 * tokens + self.slots] = 1
        return Buffers(host, host.to(self.device) if self.device.type == "cuda" else host)

    def _eager(self, key: Key, buffers: Buffers) -> Callable[[], torch.Tensor]:
        return partial(self.step, buffers.device, self.slots)

    def _capture(self, key: Key, buffers: Buffers) -> Callable[[], torch.Tensor]:
        """Record the bucket's pass as a CUDA graph over its static buffers (after one eager run on a side
        stream, as torch requires, so lazily made library state is not recorded)."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.step(buffers.device, self.slots)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(buffers.device, self.slots)

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay

    def _fill(self, batch: Batch, p: Pass, buffers: Buffers) -> None:
        write_inputs(buffers.host.numpy(), batch, p.members, p.tokens, self.slots)
        if buffers.device is not buffers.host:
            buffers.device.copy_(buffers.host, non_blocking=True)  # read before the copy out synchronises

    def _pass(self, batch: Batch, p: Pass) -> tuple[np.ndarray, int]:
        """The pass's outputs on the host [rows, slots + n_act], and the slots it ran with."""
        if batch.n_markers <= self.slots:
            out = self.cache.run(p.key, partial(self._fill, batch, p))
            return out.cpu().numpy(), self.slots
        x = np.empty((p.rows, 2 * p.tokens + 2 * batch.n_markers + 1), dtype=np.int64)
        write_inputs(x, batch, p.members, p.tokens, batch.n_markers)  # more options than slots: eagerly
        return self.step(torch.from_numpy(x).to(self.device), batch.n_markers).cpu().numpy(), batch.n_markers

    @torch.inference_mode()
    def warm(self, freeze: bool = True) -> None:
        """Capture every bucket (CUDA) or allocate its buffers (CPU): no request captures afterwards."""
        self.cache.warm(all_buckets(self.max_rows, self.max_len), freeze=freeze)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        k = batch.n_markers
        logits = np.full((batch.size, k), MASKED_LOGIT, dtype=np.float32)
        acts = np.zeros((batch.size, self.n_act), dtype=np.float32)
        for p in pack(batch.attention_mask.sum(1).tolist(), self.max_rows, self.max_len):
            out, slots = self._pass(batch, p)
            rows = list(p.members)
            logits[rows] = out[: len(rows), :k]
            acts[rows] = out[: len(rows), slots : slots + self.n_act]
        return logits, acts


class CudaRuntime(RuntimeBase):
    """`runtime="cuda"`: see the module's docstring. `warm=False` captures a bucket the first time it is
    used instead of all of them at load (scripts and tests that touch a few shapes); `max_rows` is the
    largest pass (a server's `max_batch_rows`); `graphs=False` runs the same passes eagerly."""

    name = "cuda"

    def __init__(self, checkpoint: Checkpoint, precision: str = "fp32", device: str | None = None,
                 threads: int | None = None, force: bool = False, max_rows: int = DEFAULT_MAX_ROWS,
                 warm: bool = True, graphs: bool | None = None):
        if precision not in PRECISIONS:
            raise RuntimeUnavailable(f"cuda precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.device = resolve_device(device)
        refusal = precision_refusal(precision, self.device)
        if refusal and not force:
            raise RuntimeUnavailable(f"cuda {precision} refused: {refusal}. Use precision='fp32', or pass "
                                     "force=True to run it anyway")
        if graphs and self.device.type != "cuda":
            raise RuntimeUnavailable("CUDA graphs need a CUDA device; on the CPU the passes run eagerly")
        if not isinstance(max_rows, int) or max_rows < 1:
            raise RuntimeUnavailable(f"max_rows must be a positive integer, got {max_rows!r}")
        if threads:
            torch.set_num_threads(int(threads))
        if self.device.type == "cuda":
            exact_fp32()
        self.checkpoint, self.precision, self.force = checkpoint, precision, force
        self.max_rows, self.graphs = max_rows, self.device.type == "cuda" if graphs is None else bool(graphs)
        # fp16 as published: exact, and gathered on the device inside the graph
        self.embeddings = torch.from_numpy(checkpoint.stored(EMBEDDINGS)).to(self.device)
        self.gate: dict[str, Any] | None = None
        self._nets: dict[Plan, RowNet] = {}
        self.plan = self._choose_plan()
        net = self._net(self.plan)
        self._nets = {}  # the networks only the gate needed
        self.runner = self._runner(net, self.graphs)
        self.warm_s: float | None = None
        if warm:
            started = time.perf_counter()
            self.runner.warm()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.warm_s = round(time.perf_counter() - started, 3)

    def _net(self, plan: Plan) -> RowNet:
        if plan not in self._nets:
            self._nets[plan] = RowNet(self.checkpoint, plan).eval().to(self.device)
        return self._nets[plan]

    def _runner(self, net: RowNet, graphs: bool) -> BucketRunner:
        cfg = self.checkpoint.config
        return BucketRunner(net, self.embeddings, cfg.n_act, self.max_rows, cfg.max_len, graphs)

    def _key(self, plan: Plan) -> str:
        """A gate record's cache key: per checkpoint, plan and device (its arithmetic decides the record)."""
        if self.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(self.device)
            where = f"{torch.cuda.get_device_name(self.device)}-sm{major}{minor}-cuda{torch.version.cuda}"
        else:
            from laya.native.cpu import cpu

            where = f"cpu-{cpu().key}"
        where = re.sub(r"[^A-Za-z0-9.]+", "_", f"{where}-torch{torch.__version__}")
        return f"cuda-gate-{plan.key}-r{REVISION}-{self.checkpoint.fingerprint[:16]}-{where}"

    def _choose_plan(self) -> Plan:
        """The first plan whose eager run passes the gate (`first_passing_plan`), against the fp32 network on
        the same device, built only when a record is measured (not found in the cache)."""
        reference: list[BucketRunner] = []

        def fp32() -> BucketRunner:
            if not reference:
                reference.append(self._runner(self._net(Plan()), graphs=False))
            return reference[0]

        def gate(plan: Plan) -> dict[str, Any]:
            def now() -> dict[str, Any]:
                return measure(self.checkpoint, fp32().forward, self._runner(self._net(plan), False).forward,
                               self.precision)

            return {**cached_gate(self._key(plan), now), "plan": plan.describe()}

        plan, self.gate = first_passing_plan("cuda", self.precision, self.checkpoint, plans(self.precision), gate,
                                             self.force)
        return plan

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        return self.runner.forward(batch)

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return str(torch.cuda.get_device_name(self.device))
        return super().device_name()

    def details(self) -> dict[str, Any]:
        """What runs, for `laya info`, /health and the benchmarks."""
        return {"device": device_label(self.device), "plan": self.plan.describe(), "graphs": self.graphs,
                "buckets": len(all_buckets(self.max_rows, self.checkpoint.config.max_len)),
                "captured": self.runner.cache.captures, "warm_s": self.warm_s}
