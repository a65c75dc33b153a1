"""The one interface every runtime implements, and the registry that creates them by name.

A runtime turns a checkpoint's weights into its own form once, then answers `forward(batch)`:
option logits [N, K] (fp32, -1e4 where `marker_mask` is false) and act-head logits [N, n_act].
Everything before (rows, batching) and after (temperatures, answers) is shared policy.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import platform
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from laya.errors import RuntimeUnavailable

if TYPE_CHECKING:
    from laya.encoder.batch import Batch
    from laya.encoder.checkpoint import Checkpoint


@dataclass(frozen=True)
class RuntimeInfo:
    """What a runtime says of itself (provenance, `laya info`, /health, the benchmarks): one record, so
    no caller probes a runtime for what it may or may not have."""

    name: str
    precision: str
    device: str
    plan: str | None = None
    gate: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Compact:
    """Compact prompts (Core ML's opt-in mode): rows longer than `length` tokens are shortened to it when
    the question's options fit in `slots`, so they run on the Neural Engine's fixed-shape programs."""

    length: int
    slots: int


@runtime_checkable
class Runtime(Protocol):
    name: str
    precision: str

    def info(self) -> RuntimeInfo: ...

    def compact(self) -> Compact | None: ...

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]: ...


class RuntimeBase:
    """The contract's defaults: a CPU runtime with no gate, no plan and no compact mode. A runtime
    overrides what it has (a gate record, a plan in `details`, a GPU, compact prompts)."""

    name: str = ""
    precision: str = "fp32"
    gate: dict[str, Any] | None = None

    def device_name(self) -> str:
        """Where it computes: this processor (a GPU runtime names its GPU)."""
        from laya.native.cpu import cpu

        return cpu().model or platform.machine() or "cpu"

    def details(self) -> dict[str, Any]:
        return {}

    def info(self) -> RuntimeInfo:
        details = self.details()
        plan = details.get("plan")
        return RuntimeInfo(self.name, self.precision, self.device_name(), plan if isinstance(plan, str) else None,
                           self.gate, details)

    def compact(self) -> Compact | None:
        return None

    def forward(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


# name -> (module, class, the import that must succeed for it to be available)
RUNTIMES: dict[str, tuple[str, str, str]] = {
    "torch": ("laya.encoder.runtimes.pytorch", "TorchRuntime", "torch"),
    "packed": ("laya.encoder.runtimes.packed", "PackedRuntime", "torch"),
    "onnx": ("laya.encoder.runtimes.onnx", "OnnxRuntime", "onnxruntime"),
    "mlx": ("laya.encoder.runtimes.mlx", "MlxRuntime", "mlx"),
    "coreml": ("laya.encoder.runtimes.coreml", "CoremlRuntime", "coremltools"),
    "llama": ("laya.encoder.runtimes.llama", "LlamaRuntime", "llama_cpp"),
    "cuda": ("laya.encoder.runtimes.cuda", "CudaRuntime", "torch"),
}

EXTRAS = {"torch": "torch", "onnxruntime": "onnx", "mlx": "mlx", "coremltools": "coreml", "llama_cpp": "llama"}


def available_runtimes() -> list[str]:
    return [name for name, (_, _, probe) in RUNTIMES.items() if importlib.util.find_spec(probe) is not None]


def runtime_class(name: str) -> type:
    """The class of runtime `name`, once its framework is known to be installed."""
    if name not in RUNTIMES:
        raise RuntimeUnavailable(f"unknown runtime {name!r}; known runtimes: {', '.join(RUNTIMES)}")
    module_name, class_name, probe = RUNTIMES[name]
    if importlib.util.find_spec(probe) is None:
        raise RuntimeUnavailable(
            f"runtime {name!r} needs the {probe!r} package; install the extra: "
            f"pip install 'laya-runtime[{EXTRAS.get(probe, name)}]'"
        )
    return getattr(importlib.import_module(module_name), class_name)


def check_options(name: str, options: dict[str, Any]) -> None:
    """Refuse options the runtime does not take, before anything slow (an export) happens."""
    accepted = set(inspect.signature(runtime_class(name)).parameters) - {"self", "checkpoint"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise RuntimeUnavailable(f"runtime {name!r} takes no option {', '.join(map(repr, unknown))}; "
                                 f"it takes {', '.join(sorted(accepted)) or 'none'}")


def create_runtime(name: str, checkpoint: Checkpoint, **options: Any) -> Runtime:
    check_options(name, options)
    return runtime_class(name)(checkpoint, **options)
