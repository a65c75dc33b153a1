"""`runtime="packed"`: the fast CPU runtime, rows packed instead of padded, on the matrix units.

Each row runs alone at its exact length (`rownet.RowNet`): no padding is computed, nothing masks a
global layer, and a row's answer never depends on what shares its batch (the matrix kernels pick
their blocking by the number of rows they are given, so a batched product would). Its precisions:

- `fp32`: the exact path, within 1e-4 of the reference runtime;
- `bf16`: the matrix products and attention on bf16 units (AMX, AVX512-BF16; emulated and slow on
  other processors, so refused there unless forced), the residual stream, norms, RoPE, the scorer
  and the act head in fp32;
- `int8`: the encoder's projections as int8 products in two levels (`rownet.Projection`: three int8
  products of about 15 bits with an fp32 output, on AMX-INT8 or VNNI once compiled), attention and the
  head in bf16 where the processor has bf16 units, else fp32. Near fp32's answers (a full-size
  checkpoint's moved 0.015, where bf16 moved them 0.037); on an AMX Xeon its int8 products run at half
  bf16's rate, so it takes about twice bf16's time there, and 0.6-1.0x ONNX fp32's;
- `fp16`: as bf16 with 11-bit fractions, where the processor computes fp16 (AVX512-FP16, AMX-FP16).

A reduced precision answers only within the precision standard (`laya.encoder.gate`) on the checkpoint at
hand: its gate tries the plan with every encoder layer reduced, then with the first kept in fp32, then
the first two (rounding there is carried through every later layer), and keeps the first that passes.

The network is compiled ahead of time by TorchInductor (`compiled.py`, cached: about a minute at the
first load of a checkpoint on a machine) where a C++ compiler is found, else it runs eagerly; the
compiled program is gated again, since fusion moves the rounding points.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from laya.encoder.batch import Batch
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.gate import GateFailed, cached_gate, describe, measure
from laya.encoder.runtimes.base import RuntimeBase
from laya.encoder.runtimes.compiled import (
    cached_program,
    compile_row_program,
    compiler_problem,
    example_length,
    load_program,
    target,
)
from laya.encoder.runtimes.rownet import EMBEDDINGS, PRECISIONS, Plan, RowNet, first_passing_plan, tried_plans
from laya.errors import RuntimeUnavailable
from laya.native.cpu import cpu

log = logging.getLogger("laya")
# Bumped whenever the network or its plans change, so that cached programs and gate records are remade.
REVISION = 2
# encoder layers kept in fp32, tried in this order by the gate: rounding in the first layers is carried
# through every later one (on the adversarial test checkpoint, the richer gate's rows moved 0.087 with
# every layer reduced, 0.074 with the first in fp32, 0.019 with the first two)
FP32_LAYER_TIERS = (0, 1, 2)
Row = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def precision_refusal(precision: str) -> str | None:
    """Why `precision` would run emulated (many times slower than fp32) or saturate on this processor, or None."""
    machine = cpu()
    if precision == "bf16":
        return machine.bf16_refusal()
    if precision == "int8":
        return machine.int8_refusal()
    if precision == "fp16" and not ({"avx512_fp16", "amx_fp16", "fphp", "asimdhp"} & machine.flags):
        return f"this CPU ({machine.model}) has no fp16 arithmetic (avx512_fp16 or amx_fp16): fp16 would be emulated"
    return None


def plans(precision: str) -> list[Plan]:
    """The plans a precision's gate tries, in order (int8's attention in bf16 where bf16 has units)."""
    attention = precision if precision != "int8" else ("bf16" if cpu().bf16_units else "fp32")
    return tried_plans(precision, attention, FP32_LAYER_TIERS)


class RowByRow:
    """`forward(batch)` over any way of running one unpadded row (an eager network or a program)."""

    def __init__(self, row: Row, embeddings: torch.Tensor):
        self.row, self.embeddings = row, embeddings

    @torch.inference_mode()
    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        def one(i: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
            emb = self.embeddings[torch.from_numpy(batch.input_ids[i, :n])].float()[None]
            z, act = self.row(emb, torch.from_numpy(batch.marker_pos[i : i + 1, :k]),
                              torch.ones(1, k, dtype=torch.bool), torch.from_numpy(batch.qtype[i : i + 1]))
            return z[0].numpy(), act[0].float().numpy()

        return batch.per_row(one)


def _eager(net: RowNet) -> Row:
    return lambda emb, pos, mask, qtype: net(emb, None, pos, mask, qtype)


class PackedRuntime(RuntimeBase):
    """`runtime="packed"`: see the module's docstring."""

    name = "packed"

    def __init__(self, checkpoint: Checkpoint, threads: int | None = None, precision: str = "fp32",
                 force: bool = False, compiled: bool | None = None):
        if precision not in PRECISIONS:
            raise RuntimeUnavailable(f"packed precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        refusal = precision_refusal(precision)
        if refusal and not force:
            raise RuntimeUnavailable(f"packed {precision} refused: {refusal}. Use precision='fp32' (or another "
                                     "runtime), or pass force=True to run it anyway")
        if compiled not in (None, True, False):
            raise RuntimeUnavailable(f"compiled takes True, False or None (compile where a compiler is found), "
                                     f"not {compiled!r}")
        if threads:
            torch.set_num_threads(int(threads))
        self.checkpoint, self.precision, self.force = checkpoint, precision, force
        # fp16 as published: exact
        self.embeddings = torch.from_numpy(checkpoint.stored(EMBEDDINGS))
        self.gate: dict[str, Any] | None = None
        self._reference: RowByRow | None = None
        self.plan = self._choose_plan()
        problem = compiler_problem() if compiled is not False else "compiled=False"
        if compiled and problem:
            raise RuntimeUnavailable(f"packed: cannot compile: {problem}")
        self.compiled, self.eager_reason = False, problem
        row = None
        if problem is None:
            try:
                row = self._compiled_row()
                self.compiled = True
            except GateFailed:
                raise
            except Exception as exc:  # noqa: BLE001 - a compiler failure leaves the eager network
                if compiled:
                    raise RuntimeUnavailable(f"packed: compiling failed: {exc}") from exc
                self.eager_reason = f"compiling failed ({type(exc).__name__}: {str(exc)[:200]})"
                log.warning("packed: %s; running eagerly", self.eager_reason)
        self.net: RowNet | None = None
        if row is None:  # the eager network
            self.net = RowNet(checkpoint, self.plan).eval()
            row = _eager(self.net)
        self._rows = RowByRow(row, self.embeddings)
        self._reference = None  # the fp32 network was only needed to gate

    def _key(self, plan: Plan, what: str) -> str:
        """A cache key: gate records per processor (its arithmetic decides them), programs per compile target."""
        where = target() if what == "program" else f"{cpu().key}-torch{torch.__version__}"
        return f"packed-{what}-{plan.key}-r{REVISION}-{self.checkpoint.fingerprint[:16]}-{where}"

    def reference(self) -> RowByRow:
        """The fp32 network, eager: what the gates measure against."""
        if self._reference is None:
            self._reference = RowByRow(_eager(RowNet(self.checkpoint, Plan()).eval()), self.embeddings)
        return self._reference

    def _eager_rows(self, plan: Plan) -> RowByRow:
        return RowByRow(_eager(RowNet(self.checkpoint, plan).eval()), self.embeddings)

    def _gate(self, plan: Plan, what: str, run: Callable[[], RowByRow]) -> dict[str, Any]:
        def now() -> dict[str, Any]:
            return measure(self.checkpoint, self.reference().forward, run().forward, self.precision)

        record = cached_gate(self._key(plan, f"gate-{what}"), now)
        return {**record, "plan": plan.describe()}

    def _choose_plan(self) -> Plan:
        """The first plan whose eager run passes the gate (`first_passing_plan`)."""
        plan, self.gate = first_passing_plan("packed", self.precision, self.checkpoint, plans(self.precision),
                                             lambda p: self._gate(p, "eager", partial(self._eager_rows, p)), self.force)
        return plan

    def _compiled_row(self) -> Row:
        enc, max_len = self.checkpoint.encoder, self.checkpoint.config.max_len

        def build(path) -> None:
            compile_row_program(RowNet(self.checkpoint, self.plan).eval(), enc.hidden_size,
                                example_length(enc.local_attention // 2, max_len), path)

        program = load_program(cached_program(self._key(self.plan, "program"), build))
        if self.precision != "fp32":
            self.gate = self._gate(self.plan, "compiled", lambda: RowByRow(program, self.embeddings))
            if not self.gate["passed"] and not self.force:
                raise GateFailed(f"packed {self.precision}, compiled, failed its accuracy gate on "
                                 f"{self.checkpoint.path} ({describe(self.gate)}). Use precision='fp32', pass "
                                 "compiled=False, or pass force=True to accept it", self.gate)
        return program

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        return self._rows.forward(batch)

    def details(self) -> dict[str, Any]:
        """What runs, for `laya info`, /health and the benchmarks."""
        return {"plan": self.plan.describe(), "compiled": self.compiled,
                **({"eager_because": self.eager_reason} if not self.compiled else {})}
