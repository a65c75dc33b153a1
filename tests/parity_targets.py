"""The runtimes the parity suite checks, each with its precision's tolerance.

A new runtime adds its targets here; `test_parity.py` then holds it to the upstream goldens and
to the reference runtime with the same cases. fp32 targets must match within 1e-4 with no flips;
reduced-precision targets within their bound, with no flips where the reference's top-two margin
exceeds twice that bound.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from laya.runtimes import RUNTIMES, available_runtimes

REFERENCE = "torch"


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
    ParityTarget("onnx", {"precision": "int8", "force": True}, max_dp=0.1, label="onnx-int8", gated=True),
    # bf16, the published checkpoints' training precision: its load-time gate must pass on every checkpoint
    # here (not excused like int8). Forced, so that CPUs without bf16 units check it too (emulated there:
    # slow, the same numbers).
    ParityTarget("torch", {"precision": "bf16", "force": True}, max_dp=0.02, label="torch-bf16"),
    # auto: whatever this machine picks, held to the loosest bound of what it may pick (bf16's).
    ParityTarget("auto", max_dp=0.02, label="auto"),
    ParityTarget("mlx", {"precision": "fp32"}, label="mlx-fp32"),
    ParityTarget("mlx", {"precision": "fp16"}, max_dp=0.02, label="mlx-fp16"),
    # Core ML, verified without a Mac: (a) the fp32 torch graphs the programs are converted from (general
    # and channel-first Neural Engine ones, rows routed as on a Mac); (c) the saved fp16 programs run by
    # laya's numpy MIL evaluator.
    ParityTarget("coreml", {"executor": "torch"}, label="coreml-torch-fp32"),
    ParityTarget("coreml", {"executor": "mil"}, max_dp=0.02, label="coreml-mil-fp16"),
]
if sys.platform == "darwin":  # on a Mac, Core ML itself
    TARGETS.append(ParityTarget("coreml", {"executor": "coreml"}, max_dp=0.02, label="coreml-fp16"))


def installed_targets() -> list[ParityTarget]:
    """Targets whose runtime is installed; on CI every registered runtime must be."""
    have = set(available_runtimes())
    if os.environ.get("CI"):
        missing = set(RUNTIMES) - have
        assert not missing, f"CI must install every runtime extra; missing: {sorted(missing)}"
    return [t for t in TARGETS if t.runtime in have or t.runtime == "auto"]
