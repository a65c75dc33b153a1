"""The encoder's lens (`laya eval --lens`): the decision head applied to every encoder layer's states,
to show at which layer an answer settles. Layer L's states go through the encoder's final norm and
the head exactly as the last layer's do, so the last layer's probabilities are the answer's (the
PyTorch reference computes them; another runtime's answer agrees to its parity bound).

Each question's row is read alone, at its canonical padded length, as `Model.run` reads it. A choice
played as a tournament has no single row and is left out of the lens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def layer_probabilities(model: Any, state: Any, questions: Mapping[str, Any], net: Any = None
                        ) -> dict[str, list[list[float]]]:
    """Per question (one-row questions only), per encoder layer, its calibrated probabilities."""
    import torch

    from laya.encoder.batch import collate, padded_length
    from laya.encoder.runtimes.pytorch import reference_net

    net = net if net is not None else reference_net(model.runtime, model.checkpoint)
    job = model.prepare([state], questions)
    one_row = [q for q in job.questions if q.qid not in job.tournaments]
    captured: list[torch.Tensor] = []

    def keep(_module, _inputs, output) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    hooks = [layer.register_forward_hook(keep) for layer in net.encoder.layers]
    out: dict[str, list[list[float]]] = {}
    try:
        with torch.inference_mode():
            for q, row in zip(one_row, job.rows[0]):
                captured.clear()
                batch = collate([row], model.tokenizer.pad_id, length=padded_length(len(row.ids)))
                ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
                net.encoder(input_ids=ids, attention_mask=mask)
                layers = []
                for h in captured:
                    logits, _ = net.decide(net.encoder.final_norm(h).float(), mask, torch.from_numpy(batch.marker_pos),
                                           torch.from_numpy(batch.marker_mask), torch.from_numpy(batch.qtype))
                    z = logits.numpy()[0, : len(row.markers)].astype(np.float32)
                    layers.append([float(v) for v in model.tempered(q, z)])
                out[q.qid] = layers
    finally:
        for hook in hooks:
            hook.remove()
    return out


def settles_at(layers: list[list[float]]) -> int:
    """The first layer (1-based) from which the top answer is the last layer's at every later layer."""
    final = int(np.argmax(layers[-1]))
    at = len(layers)
    for i in range(len(layers) - 1, -1, -1):
        if int(np.argmax(layers[i])) != final:
            break
        at = i + 1
    return at
