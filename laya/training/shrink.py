"""A smaller student cut from a laya checkpoint: N of its encoder layers, its embeddings, head and act head.

Depth is what a CPU pays for (every layer costs the same), so a student keeps fewer layers at the same
width: the embeddings and both heads stay exactly as trained, and distillation (`laya distill
--student-layers N`) then teaches the shortened encoder to give the teacher's answers.

Which layers: ModernBERT decides a layer's attention from its position (layer j is global when
`j % global_attn_every_n_layers == 0`, else it attends within the sliding window, each kind with its own
RoPE theta), and every runtime (transformers 4 and 5, upstream's loader, llama.cpp's
`sliding_window_pattern`) reads it that way. So student layer j must come from a teacher layer of the
kind position j has, or it would run with the other kind's attention and rotary base. Among the
choices that keep the kinds, the layers are spread over the teacher's depth as evenly as possible (first
and last included where the kinds allow), the first is always the teacher's first (the only layer with
no attention norm), and their order is kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from laya.encoder.checkpoint import CONFIG_FILE, ENCODER_CONFIG, WEIGHTS_FILE
from laya.encoder.config import EncoderConfig
from laya.errors import CheckpointError

LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)$")


def student_kinds(n_layers: int, every: int) -> list[bool]:
    """Whether each of a student's layers is global, as every loader will read it (`j % every == 0`)."""
    return [j % every == 0 for j in range(n_layers)]


def kept_layers(encoder: EncoderConfig, n_layers: int) -> list[int]:
    """The teacher layers a student of `n_layers` keeps, in order (see the module's note)."""
    total = encoder.num_hidden_layers
    if not 1 <= n_layers <= total:
        raise CheckpointError(f"a student keeps 1 to {total} of this encoder's {total} layers, not {n_layers}")
    want = student_kinds(n_layers, encoder.global_attn_every_n_layers)
    kinds = [encoder.is_global(i) for i in range(total)]
    if not kinds[0]:
        raise CheckpointError("the encoder's first layer is not global; no student can keep the layer order")
    ideal = [0.0] if n_layers == 1 else [j * (total - 1) / (n_layers - 1) for j in range(n_layers)]
    return _closest_chain(kinds, want, ideal)


def _closest_chain(kinds: Sequence[bool], want: Sequence[bool], ideal: Sequence[float]) -> list[int]:
    """Increasing layer indices t_0 = 0 < t_1 < ... with kinds[t_j] == want[j], nearest `ideal` in squares
    (a small dynamic programme over positions and layers)."""
    total, n = len(kinds), len(want)
    inf = float("inf")
    cost = [[inf] * total for _ in range(n)]
    back = [[-1] * total for _ in range(n)]
    cost[0][0] = 0.0  # the first layer is the teacher's first: it alone has no attention norm
    for j in range(1, n):
        best, best_at = inf, -1
        for t in range(total):
            if t >= 1 and cost[j - 1][t - 1] < best:
                best, best_at = cost[j - 1][t - 1], t - 1
            if kinds[t] == want[j] and best < inf:
                cost[j][t] = best + (t - ideal[j]) ** 2
                back[j][t] = best_at
    end = min(range(total), key=lambda t: cost[n - 1][t])
    if cost[n - 1][end] == inf:
        raise CheckpointError(f"this encoder's layers cannot give a {n}-layer student with its attention pattern")
    chain = [end]
    for j in range(n - 1, 0, -1):
        chain.append(back[j][chain[-1]])
    return chain[::-1]


def shrink(model: str | os.PathLike[str], n_layers: int, out: str | os.PathLike[str]) -> Path:
    """Write to `out` a checkpoint in the published format keeping `n_layers` of `model`'s encoder layers
    (`kept_layers`); the file set, dtypes and head are the source's. Returns `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from laya.encoder.loading import load_model_checkpoint

    source, _, kind = load_model_checkpoint(model)
    if kind is not None:
        raise CheckpointError(f"{model} is a {kind} bundle; shrink the checkpoint it was exported from")
    keep = kept_layers(source.encoder, n_layers)
    renumber = {teacher: student for student, teacher in enumerate(keep)}
    tensors: dict[str, Any] = {}
    with safe_open(str(source.path / WEIGHTS_FILE), "pt") as weights:
        metadata = weights.metadata()
        for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
            matched = LAYER.match(name)
            if matched is None:
                tensors[name] = weights.get_tensor(name)
            elif int(matched.group(1)) in renumber:
                tensors[f"encoder.layers.{renumber[int(matched.group(1))]}.{matched.group(2)}"] = \
                    weights.get_tensor(name)
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source.path / "tokenizer", out / "tokenizer")
    (out / "encoder").mkdir(parents=True)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata=metadata)
    _write_json(out / ENCODER_CONFIG, _student_encoder_config(source.encoder, keep))
    agent = json.loads((source.path / CONFIG_FILE).read_text(encoding="utf-8"))
    agent["student"] = {"teacher_layers": source.encoder.num_hidden_layers, "kept_layers": keep}
    _write_json(out / CONFIG_FILE, agent)
    return out


def _student_encoder_config(encoder: EncoderConfig, keep: Sequence[int]) -> dict[str, Any]:
    config = dict(encoder.raw)
    config["num_hidden_layers"] = len(keep)
    if "layer_types" in config:
        config["layer_types"] = ["full_attention" if g else "sliding_attention"
                                 for g in student_kinds(len(keep), encoder.global_attn_every_n_layers)]
    return config


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
