"""The runtimes the parity suite checks, each with its precision's tolerance.

A new runtime adds its targets here; `test_parity.py` then holds it to the upstream goldens and
to the reference runtime with the same cases. fp32 targets must match within 1e-4 with no flips;
reduced-precision targets within their bound, with no flips where the reference's top-two margin
exceeds twice that bound. `auto` is held to the bound of the runtime and precision it chose on the
machine at hand (`as_ran`), so its verdict does not depend on the processor.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from laya.encoder.gate import PROMISED
from laya.encoder.runtimes import RUNTIMES, available_runtimes

REFERENCE = "torch"
AUTO = "auto"
# Each precision's bound in probability against the fp32 reference, on any input: fp32 1e-4 (and no
# argmax flip at all); bf16 the precision standard's 0.05 (laya/encoder/gate.py); fp16 0.02; int8 0.1, twice
# its gate's 0.05 on the gate's fixed rows (docs/runtimes.md, ONNX).
PRECISION_BOUNDS = {"fp32": 1e-4, "bf16": PROMISED["bf16"].max_dp, "fp16": PROMISED["fp16"].max_dp, "int8": 0.1,
                    # llama.cpp's GGUF types: f32 is fp32; f16 as fp16; q8_0 (int8 blocks) as int8
                    "f32": 1e-4, "f16": PROMISED["f16"].max_dp, "q8_0": 0.1}


def bound_of(precision: str) -> float:
    """The bound of a precision; a routed runtime's ("fp16+fp16") is its loosest part's."""
    return max(PRECISION_BOUNDS[p] for p in precision.split("+"))


@dataclass(frozen=True)
class ParityTarget:
    runtime: str
    options: dict[str, Any] = field(default_factory=dict)
    max_dp: float = 1e-4
    label: str = ""
    gated: bool = False  # an export gate decides whether the bound is promised (int8)

    @property
    def id(self) -> str:
        return self.label or self.runtime

    @property
    def exact(self) -> bool:
        """fp32 targets: no argmax flip at all, whatever the margin."""
        return self.max_dp <= 1e-4


TARGETS = [
    ParityTarget("torch", label="torch-fp32"),
    ParityTarget("onnx", {"precision": "fp32"}, label="onnx-fp32"),
    # int8: a bundle is only usable when its export gate passed (max |dp| <= 0.05 on the gate's fixed
    # rows); on arbitrary inputs its documented bound is 0.1, with no flip past twice that margin.
    # Where the gate fails, loading without force must be refused, and the forced run is still held
    # to the same bound: a failed gate never makes the target pass without comparing.
    ParityTarget("onnx", {"precision": "int8", "force": True}, max_dp=PRECISION_BOUNDS["int8"], label="onnx-int8",
                 gated=True),
    # the packed runtime: fp32 as a network (eager) is exact; bf16, the published checkpoints' training
    # precision, as users get it (compiled where a C++ compiler is found, as on CI): its load-time gate must
    # pass on every checkpoint here (not excused like int8). Forced, so that CPUs without bf16 units check it
    # too (emulated there: slow, the same numbers). int8 gated like ONNX's.
    ParityTarget("packed", {"precision": "fp32", "compiled": False}, label="packed-fp32"),
    ParityTarget("packed", {"precision": "bf16", "force": True}, max_dp=PRECISION_BOUNDS["bf16"], label="packed-bf16"),
    ParityTarget("packed", {"precision": "int8", "force": True, "compiled": False}, max_dp=PRECISION_BOUNDS["int8"],
                 label="packed-int8", gated=True),
    # auto: whatever this machine picks, measured at first load as a user's first load measures (the
    # tests otherwise run auto's fixed rule, see conftest.auto_by_rule), held to the bound of the runtime
    # and precision it picked (`as_ran`). NaN until then: an unresolved use fails.
    ParityTarget(AUTO, {"measure": True, "background": False}, max_dp=float("nan"), label=AUTO),
    # llama.cpp (a GGUF encoder, the head in numpy): f32 exact (with scripts/llama-modern-bert.patch's exact
    # GELU, which the runtime checks at load); f16 and q8_0 gated at export like int8, held to their bounds
    ParityTarget("llama", {"precision": "f32"}, label="llama-f32"),
    ParityTarget("llama", {"precision": "f16", "force": True}, max_dp=PRECISION_BOUNDS["f16"], label="llama-f16",
                 gated=True),
    ParityTarget("llama", {"precision": "q8_0", "force": True}, max_dp=PRECISION_BOUNDS["q8_0"], label="llama-q8_0",
                 gated=True),
    ParityTarget("mlx", {"precision": "fp32"}, label="mlx-fp32"),
    ParityTarget("mlx", {"precision": "fp16"}, max_dp=PRECISION_BOUNDS["fp16"], label="mlx-fp16"),
    # the CUDA runtime's code path (buckets, packing, padded rows and tokens masked) on the CPU device, where
    # its graphs are eager calls through the same bucket cache; its GPU precisions: scripts/gpu-check.sh
    ParityTarget("cuda", {"precision": "fp32", "device": "cpu"}, label="cuda-cpu-fp32"),
    # Core ML, verified without a Mac: (a) the fp32 torch graphs the programs are converted from (general
    # and channel-first Neural Engine ones, rows routed as on a Mac); (c) the saved fp16 programs run by
    # laya's numpy MIL evaluator.
    ParityTarget("coreml", {"executor": "torch"}, label="coreml-torch-fp32"),
    ParityTarget("coreml", {"executor": "mil"}, max_dp=PRECISION_BOUNDS["fp16"], label="coreml-mil-fp16"),
]
if sys.platform == "darwin":  # on a Mac, Core ML itself
    TARGETS.append(ParityTarget("coreml", {"executor": "coreml"}, max_dp=PRECISION_BOUNDS["fp16"],
                                label="coreml-fp16"))


def as_ran(target: ParityTarget, model) -> ParityTarget:
    """The target whose bound applies to what ran: a named runtime is its own; `auto` becomes the
    runtime and precision it chose here, with that precision's bound, named in its id (and so in
    every assertion message)."""
    if target.runtime != AUTO:
        return target
    assert model.choice is not None, "runtime='auto' loaded a model without saying what it chose"
    precision = model.runtime.precision
    bound = bound_of(precision)
    return ParityTarget(model.choice.runtime, {"precision": precision}, max_dp=bound,
                        label=f"auto (chose {model.choice.runtime} {precision}, bound {bound:g})")


def installed_targets() -> list[ParityTarget]:
    """Targets whose runtime is installed; on CI every registered runtime must be."""
    have = set(available_runtimes())
    if os.environ.get("CI"):
        missing = set(RUNTIMES) - have
        assert not missing, f"CI must install every runtime extra; missing: {sorted(missing)}"
    return [t for t in TARGETS if t.runtime in have or t.runtime == AUTO]
