"""The two configs of a checkpoint, parsed and validated without any framework.

`rl_agent_config.json` describes the decision model, `encoder/config.json` the ModernBERT encoder.
Both are read into frozen dataclasses once, so every runtime sees the same resolved values
(in particular the two RoPE thetas, whose transformers-5 spelling is easy to misread).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laya.errors import CheckpointError
from laya.questions import QTYPES  # noqa: F401 - the configs name question types by it


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc


def _int(data: dict, key: str, default: int | None, path: Path, minimum: int = 0) -> int:
    value = data.get(key, default)
    if value is None:
        raise CheckpointError(f"{path}: missing required key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CheckpointError(f"{path}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class AgentConfig:
    """`rl_agent_config.json`. Temperatures are kept raw here; calibration clamps them."""

    encoder: str
    head_layers: int = 2
    n_act: int = 2
    max_len: int = 512
    head_max_len: int = 192
    temperature: tuple[Any, Any, Any] = (1.0, 1.0, 1.0)
    temperature_by_options: dict[str, Any] = field(default_factory=dict)
    # False for a model read from a GGUF without an act head (llama.cpp's laya format has none): its
    # answers carry x_act_probability null with the reason, not a figure from zeros
    act_head: bool = True

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> AgentConfig:
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: must hold a JSON object, got {type(data).__name__}")
        encoder = data.get("encoder")
        if not isinstance(encoder, str) or not encoder:
            raise CheckpointError(f"{path}: 'encoder' must be a non-empty string, got {encoder!r}")
        act_costs = data.get("act_costs", {})
        if act_costs is None:
            act_costs = {}
        if not isinstance(act_costs, dict):
            raise CheckpointError(f"{path}: 'act_costs' must be an object, got {act_costs!r}")
        temperature = data.get("temperature", [1.0, 1.0, 1.0])
        if not isinstance(temperature, list) or len(temperature) != 3:
            raise CheckpointError(
                f"{path}: 'temperature' must be a list of 3 numbers (choice, score, noul), got {temperature!r}"
            )
        by_options = data.get("temperature_by_options", {})
        if by_options is None:
            by_options = {}
        if not isinstance(by_options, dict):
            raise CheckpointError(f"{path}: 'temperature_by_options' must be an object, got {by_options!r}")
        layout = data.get("option_layout", "sequential")
        if layout != "sequential":
            if layout == "parallel":
                raise CheckpointError(
                    f"{path}: option_layout 'parallel' is not supported by this runtime "
                    "(every published checkpoint is 'sequential')"
                )
            raise CheckpointError(f"{path}: unknown option_layout {layout!r}")
        max_len = _int(data, "max_len", 512, path, minimum=8)
        head_max_len = _int(data, "head_max_len", 192, path, minimum=8)
        return cls(
            encoder=encoder,
            head_layers=_int(data, "head_layers", 2, path),
            n_act=len(act_costs) + 1,
            max_len=max_len,
            head_max_len=head_max_len,
            temperature=tuple(temperature),
            temperature_by_options=dict(by_options),
            act_head=data.get("x_act_head", True) is not False,
        )


@dataclass(frozen=True)
class EncoderConfig:
    """The ModernBERT hyper-parameters the maths needs, with both RoPE thetas resolved."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    norm_eps: float = 1e-5
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    layer_types: tuple[str, ...] = ()
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` attends fully (else within the sliding window)."""
        if self.layer_types:
            return self.layer_types[layer] == "full_attention"
        return layer % self.global_attn_every_n_layers == 0

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> EncoderConfig:
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: must hold a JSON object")
        model_type = data.get("model_type")
        if model_type != "modernbert":
            raise CheckpointError(
                f"{path}: model_type {model_type!r} is not supported; laya checkpoints use a "
                "ModernBERT encoder (model_type 'modernbert')"
            )
        for flag in ("attention_bias", "mlp_bias", "norm_bias"):
            if data.get(flag):
                raise CheckpointError(f"{path}: {flag}=true is not part of the laya format (no encoder biases)")
        act = data.get("hidden_activation", "gelu")
        if act not in ("gelu", "gelu_python"):
            raise CheckpointError(f"{path}: hidden_activation {act!r} is not supported (exact GELU only)")
        global_theta, local_theta = _rope_thetas(data, path)
        hidden = _int(data, "hidden_size", None, path, minimum=1)
        heads = _int(data, "num_attention_heads", None, path, minimum=1)
        if hidden % heads:
            raise CheckpointError(f"{path}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        layers = _int(data, "num_hidden_layers", None, path, minimum=1)
        layer_types = data.get("layer_types") or ()
        if layer_types and (
            len(layer_types) != layers
            or any(t not in ("full_attention", "sliding_attention") for t in layer_types)
        ):
            raise CheckpointError(f"{path}: layer_types must list {layers} of full_attention/sliding_attention")
        eps = data.get("norm_eps", 1e-5)
        if not isinstance(eps, int | float) or isinstance(eps, bool) or not eps > 0:
            raise CheckpointError(f"{path}: norm_eps must be a positive number, got {eps!r}")
        return cls(
            vocab_size=_int(data, "vocab_size", None, path, minimum=1),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=_int(data, "intermediate_size", None, path, minimum=1),
            norm_eps=float(eps),
            global_rope_theta=global_theta,
            local_rope_theta=local_theta,
            local_attention=_int(data, "local_attention", 128, path, minimum=2),
            global_attn_every_n_layers=_int(data, "global_attn_every_n_layers", 3, path, minimum=1),
            layer_types=tuple(layer_types),
            raw=data,
        )


def _theta(value: Any, what: str, path: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise CheckpointError(f"{path}: {what} must be a positive number, got {value!r}")
    return float(value)


def _rope_thetas(data: dict, path: Path) -> tuple[float, float]:
    """Global and local RoPE bases, from either spelling.

    transformers 5 re-saves configs with `rope_parameters = {"full_attention": {...},
    "sliding_attention": {...}}`; older files carry `global_rope_theta` / `local_rope_theta`.
    mmBERT uses 160000 for both, so falling back to ModernBERT's local default of 10000 would
    silently change every answer: the nested form wins when present.
    """
    global_theta = _theta(data.get("global_rope_theta", 160000.0), "global_rope_theta", path)
    local_theta = _theta(data.get("local_rope_theta", 10000.0), "local_rope_theta", path)
    rope = data.get("rope_parameters")
    if rope is not None:
        if not isinstance(rope, dict):
            raise CheckpointError(f"{path}: rope_parameters must be an object")
        flat = rope.get("rope_theta")
        for key, which in (("full_attention", "global"), ("sliding_attention", "local")):
            params = rope.get(key)
            theta = params.get("rope_theta") if isinstance(params, dict) else flat
            if theta is None:
                continue
            value = _theta(theta, f"rope_parameters.{key}.rope_theta", path)
            if which == "global":
                global_theta = value
            else:
                local_theta = value
    return global_theta, local_theta
