"""`laya info`: what a model is (encoder, parameters, budgets, temperatures, runtime, gate), for a person or
as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from laya.cli import common
from laya.cli.common import Subparsers


def register(sub: Subparsers) -> None:
    """Add `laya info` to the subparsers `sub`."""
    info = sub.add_parser("info", help="print the encoder, parameter count, budgets and temperatures")
    common.add_model_args(info)
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=cmd_info)


def _provenance(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    """What exactly answers, as `/v1/models` says it: the artifacts' sha256, the model digest, where
    it runs; the path as `/health` shows it (no machine path)."""
    from laya.digests import digests_of, short_digest
    from laya.engines import artifact_files
    from laya.redaction import redact

    digests = digests_of(artifact_files(Path(args.model), model.checkpoint.path))
    return {"path": redact(str(model.checkpoint.path)), "source": redact(str(model.checkpoint.source)),
            "digests": digests, "model_digest": short_digest(digests),
            "device": model.runtime.info().device}


def cmd_info(args: argparse.Namespace) -> int:
    """`laya info -m M`: the model's description, one aligned line per fact (or `--json`)."""
    model = common.load_model(args)
    info = model.info() | _provenance(args, model)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    enc = info["encoder"]
    temps = info["temperatures"]
    print(f"model        {info['name']}  ({info['path']})")
    print(f"digest       {info['model_digest']}: " + ", ".join(f"{k} {v[:16]}" for k, v in info["digests"].items()))
    print(f"device       {info['device']}")
    print(f"encoder      {enc['id']}: ModernBERT, {enc['layers']} layers, d {enc['hidden_size']}, "
          f"{enc['heads']} heads, GeGLU {enc['intermediate_size']}, vocab {enc['vocab_size']}")
    print(f"rope theta   global {enc['rope_theta']['global']:g}, local {enc['rope_theta']['local']:g}, "
          f"window {enc['local_attention']}")
    print(f"parameters   {info['parameters']:,}")
    print(f"head         {info['head_layers']} layers")
    print(f"budgets      max_len {info['max_len']}, head_max_len {info['head_max_len']}")
    print(f"temperature  choice {temps['temperature'][0]:g}, score {temps['temperature'][1]:g}, "
          f"noul {temps['temperature'][2]:g}")
    for key, value in temps["temperature_by_options"].items():
        print(f"             {key} {value:g}")
    print(f"runtime      {info['runtime']} ({info['precision']})")
    if model.choice is not None:
        print(f"             {model.choice.describe()}")
        lines = model.choice.measurement_lines()
        for i, line in enumerate(lines):
            print(f"{'measured' if i == 0 else '':13s}{line}")
    if info["gate"]:
        from laya.encoder.gate import describe

        print(f"gate         {'passed' if info['gate']['passed'] else 'FAILED (forced)'}: {describe(info['gate'])}")
    return 0
