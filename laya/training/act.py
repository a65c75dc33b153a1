"""Fitting the act head to predict whether the decision is right, so `x_act_probability` becomes a real
abstain signal (upstream's trainer leaves it untrained: it reads ~1.0 on every input).

The decision network is frozen; on held-out answers (the training answers are nearly all right once
fitted, so they teach nothing about mistakes) the act head learns P(right) = softmax(act)[0] from
what it reads in the format: the CLS vector after the head layers and the four features of the
untempered option distribution. Its inputs are standardised during fitting (head activations reach
1e3-1e4) and the standardisation is folded into its first layer, so the saved head has the exact
published shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from laya.calibration.metrics import auroc
from laya.checkpoint import Checkpoint
from laya.training.examples import Example, batch_of

STEPS = 400
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 1e-2
VALIDATION_SHARE = 0.25
MIN_EACH = 5  # right and wrong answers needed to fit at all


@torch.inference_mode()
def read_inputs(net: nn.Module, checkpoint: Checkpoint, examples: Sequence[Example], batch_size: int = 32
                ) -> tuple[np.ndarray, np.ndarray]:
    """The act head's inputs [n, d + 4] and whether each decision is right, for the given answers."""
    net.eval()
    device = next(net.parameters()).device
    inputs, right = [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch, _ = batch_of(checkpoint, chunk)
        t = [torch.from_numpy(getattr(batch, n)).to(device)
             for n in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")]
        h = net.encoder(input_ids=t[0], attention_mask=t[1]).last_hidden_state.float()
        logits, x = net.read(h, *t[1:])
        for i, ex in enumerate(chunk):
            right.append(int(torch.argmax(logits[i, : len(ex.target)])) == ex.label)
        inputs.append(x.double().cpu().numpy())
    return np.concatenate(inputs), np.array(right, dtype=bool)


def fit_act_head(net: nn.Module, x: np.ndarray, right: np.ndarray, seed: int) -> dict[str, Any]:
    """Fit `net.act_head` in place; returns what it was fitted on and how well it separates on its
    own validation part. Leaves the head untouched (and says why) when there is nothing to learn."""
    n_right, n_wrong = int(right.sum()), int((~right).sum())
    record: dict[str, Any] = {"target": "softmax(act)[0] = P(the decision is right)", "answers": len(right),
                              "right": n_right, "wrong": n_wrong}
    if min(n_right, n_wrong) < MIN_EACH:
        record["fitted"] = False
        record["why_not"] = (f"the held-out answers hold {n_right} right and {n_wrong} wrong decisions; at least "
                             f"{MIN_EACH} of each are needed to learn when the model is wrong")
        return record
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(right))
    cut = max(1, int(round(len(right) * VALIDATION_SHARE)))
    val, fit = order[:cut], order[cut:]
    mu, sigma = x[fit].mean(0), x[fit].std(0)
    sigma = np.where(sigma > 1e-6, sigma, 1.0)
    z = torch.from_numpy((x - mu) / sigma).float()
    y = torch.from_numpy((~right).astype(np.int64))  # class 0: act (right), class 1: escalate (wrong)
    torch.manual_seed(seed)
    first, last = net.act_head[0], net.act_head[2]
    head = nn.Sequential(nn.Linear(first.in_features, first.out_features), nn.GELU(),
                         nn.Linear(last.in_features, last.out_features))
    weights = torch.tensor([len(fit) / (2 * max(1, int(right[fit].sum()))),
                            len(fit) / (2 * max(1, int((~right[fit]).sum())))], dtype=torch.float32)
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    best = (np.inf, None, 0)
    fit_t, val_t = torch.from_numpy(fit), torch.from_numpy(val)
    for step in range(1, STEPS + 1):
        head.train()
        optimizer.zero_grad()
        loss = loss_fn(head(z[fit_t]), y[fit_t])
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            with torch.no_grad():
                val_loss = float(loss_fn(head(z[val_t]), y[val_t]))
            if val_loss < best[0]:
                best = (val_loss, {k: v.clone() for k, v in head.state_dict().items()}, step)
    head.load_state_dict(best[1])
    with torch.no_grad():
        p_right = torch.softmax(head(z[val_t]), -1)[:, 0].numpy()
        w0 = head[0].weight.double() / torch.from_numpy(sigma)[None, :]
        b0 = head[0].bias.double() - w0 @ torch.from_numpy(mu)
        first.weight.copy_(w0.float())
        first.bias.copy_(b0.float())
        last.weight.copy_(head[2].weight)
        last.bias.copy_(head[2].bias)
    record.update(fitted=True, steps=best[2], validation_answers=len(val),
                  validation_auroc=auroc(p_right, right[val]),
                  validation_auroc_top_probability=auroc(x[val, -4], right[val]))
    return record
