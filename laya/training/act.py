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
    first, last = net.act_head[0], net.act_head[2]
    # Two candidates: the option distribution's four features alone (what
    # the top probability knows, reweighed), and those with the CLS vector (what the input says about
    # the decision's reliability), which needs more answers not to overfit.
    candidates = {name: _fit_mlp(z, y, fit, val, first, last, seed, only_features=name == "features")
                  for name in ("features", "features+cls")}
    val_t = torch.from_numpy(val)
    separation = {}
    for name, (_, state, _) in candidates.items():
        head = _mlp(first, last)
        head.load_state_dict(state)
        with torch.no_grad():
            separation[name] = auroc(torch.softmax(head(z[val_t]), -1)[:, 0].numpy(), right[val]) or 0.0
    # kept by how well it separates right from wrong on the validation answers (the simpler on a tie)
    chosen = max(candidates, key=lambda name: (separation[name], name == "features"))
    _, state, steps = candidates[chosen]
    head = _mlp(first, last)
    head.load_state_dict(state)
    with torch.no_grad():
        p_right = torch.softmax(head(z[val_t]), -1)[:, 0].numpy()
        w0 = head[0].weight.double() / torch.from_numpy(sigma)[None, :]
        b0 = head[0].bias.double() - w0 @ torch.from_numpy(mu)
        first.weight.copy_(w0.float())
        first.bias.copy_(b0.float())
        last.weight.copy_(head[2].weight)
        last.bias.copy_(head[2].bias)
    record.update(fitted=True, inputs=chosen, steps=steps, validation_answers=len(val),
                  validation_auroc_by_inputs={k: round(v, 4) for k, v in separation.items()},
                  validation_auroc=auroc(p_right, right[val]),
                  validation_auroc_top_probability=auroc(x[val, -4], right[val]))
    return record


def _mlp(first: nn.Linear, last: nn.Linear) -> nn.Sequential:
    return nn.Sequential(nn.Linear(first.in_features, first.out_features), nn.GELU(),
                         nn.Linear(last.in_features, last.out_features))


def _fit_mlp(z: torch.Tensor, y: torch.Tensor, fit: np.ndarray, val: np.ndarray, first: nn.Linear, last: nn.Linear,
             seed: int, only_features: bool) -> tuple[float, dict[str, torch.Tensor], int]:
    """Full-batch AdamW with class-balanced cross-entropy; the step with the best validation loss."""
    torch.manual_seed(seed)
    head = _mlp(first, last)
    if only_features:  # the CLS columns stay zero: this head reads the four distribution features only
        with torch.no_grad():
            head[0].weight[:, :-4] = 0.0
    n_wrong = int(y[torch.from_numpy(fit)].sum())
    weights = torch.tensor([len(fit) / (2 * max(1, len(fit) - n_wrong)), len(fit) / (2 * max(1, n_wrong))],
                           dtype=torch.float32)
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    fit_t, val_t = torch.from_numpy(fit), torch.from_numpy(val)
    best: tuple[float, dict[str, torch.Tensor], int] = (float("inf"), {}, 0)
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        loss_fn(head(z[fit_t]), y[fit_t]).backward()
        if only_features:
            head[0].weight.grad[:, :-4] = 0.0
        optimizer.step()
        if only_features:
            with torch.no_grad():
                head[0].weight[:, :-4] = 0.0  # weight decay must not move them either
        if step % 10 == 0:
            with torch.no_grad():
                val_loss = float(loss_fn(head(z[val_t]), y[val_t]))
            if val_loss < best[0]:
                best = (val_loss, {k: v.clone() for k, v in head.state_dict().items()}, step)
    return best
