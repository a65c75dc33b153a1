"""Fitting the act head to predict whether the decision is right, so `x_act_probability` becomes a real
abstain signal (upstream's trainer leaves it untrained: it reads ~1.0 on every input).

The decision network is frozen; on held-out answers (the training answers are nearly all right once
fitted, so they teach nothing about mistakes) the act head learns P(right) = softmax(act)[0] from
what it reads in the format: the CLS vector after the head layers and the four features of the
untempered option distribution.

A head fitted on a few hundred answers can easily be a worse abstain signal than the top probability
it reads as an input (on a task it was not tuned on, an earlier version of this fit scored AUROC 0.41
where the top probability scored 0.71). So the top probability is itself a candidate, written in the
act head's own shape, and it is the default:

- `top_probability`: softmax(act)[0] = sigmoid(2^s * top1 - b), the slope a power of two and the
  intercept fitted by a one-dimensional logistic regression (so the value is a sensible P(right)).
  Every step of it is exact in fp32 (a power-of-two scale, GELU(u) = u for u >= 6, zero weights
  elsewhere), so it ranks answers exactly as the untempered top probability the head reads does:
  neighbouring fp32 top1 values never merge. When every fitting answer has two options it reads the
  normalised entropy instead, sigmoid(-2^s * H - b): for two options a strictly decreasing function
  of top1, so the same ranking, but resolved where fp32 top1 rounds to 1.0 (a logit gap above ~17),
  which is where a confidently wrong answer hides among confidently right ones.
- `correction:<c>:<l2>`: the same logit plus a linear correction read from the input: `c` leading
  principal components of the (standardised) CLS vector and the other three features, fitted by
  L2-regularised logistic regression with the top-probability logit as offset. It can only move an
  answer away from the top probability's ranking where the input says something the top probability
  does not (a sloppy annotator's language, a channel that is labelled badly). Two hidden units carry
  the correction exactly: GELU(u) - GELU(-u) = u.

Which one is kept is decided on the fitting answers alone: stratified k-fold cross-validation,
repeated with seeded shuffles. In every fold the candidates are fitted on the other folds and the
AUROC of each (and of the top probability) measured on the fold. A correction is kept only when its
mean gain over the top probability is at least `MARGIN` and it gains in at least `WIN_SHARE` of the
folds; otherwise the head falls back to the top probability. The chosen head is then refitted on every
fitting answer. (A full 256-unit MLP on every input, which an earlier version fitted and chose by one
25% validation split, is not a candidate: on a few hundred answers it fits noise in the CLS vector.)
The standardisation is folded into the first layer, so the saved head has the exact published shape,
saved fp32. With more than two act outputs (`act_costs`), class 0 is "act" and the others share the
escalate mass equally, so softmax(act)[0] is the same P(right).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from laya.calibration.metrics import auroc
from laya.encoder.checkpoint import Checkpoint
from laya.training.examples import Example, batch_of

MIN_EACH = 5  # right and wrong answers needed to fit at all
FOLDS = 5
REPEATS = 5  # of the k-fold split, with different shuffles
MARGIN = 0.01  # mean out-of-fold AUROC a correction must gain over the top probability to be kept
WIN_SHARE = 0.8  # ... and the share of folds in which it must gain
CORRECTIONS = ((2, 1.0), (8, 1.0), (16, 1.0))  # (principal components of the CLS vector, L2 per answer)
TOP_GAIN = 2048.0  # top1 >= 1/255, so the hidden unit 2048 * top1 >= 8, where fp32 GELU is the identity
SLOPES = tuple(range(0, 7))  # the top-probability head's slope is 2^s for one of these s
# its logit at top1 = 1 is kept at or below this (P(right) <= 1 - 2e-9): further up, the float64 softmax
# that turns act logits into a probability would merge neighbouring fp32 top1 values
MAX_LOGIT = 20.0
DEFAULT_TOP = (3, 4.0)  # sigmoid(8 * top1 - 4), when there are too few answers to fit s and b
T_MAX = {"top1": 1.0, "entropy": 0.0}  # the largest value of each plain signal (top1, minus the entropy)


@torch.inference_mode()
def read_inputs(net: nn.Module, checkpoint: Checkpoint, examples: Sequence[Example], batch_size: int = 32
                ) -> tuple[np.ndarray, np.ndarray]:
    """The act head's inputs [n, d + 4] and whether each decision is right, for the given answers (read in
    fp32, as the reference runtime serves them, whatever the processor)."""
    net.eval()
    device = next(net.parameters()).device
    inputs, right = [], []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch, _ = batch_of(checkpoint, chunk)
        t = [torch.from_numpy(getattr(batch, n)).to(device)
             for n in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")]
        with torch.autocast(device.type, enabled=False):
            h = net.encoder(input_ids=t[0], attention_mask=t[1]).last_hidden_state.float()
            logits, x = net.read(h, *t[1:])
        for i, ex in enumerate(chunk):
            right.append(int(torch.argmax(logits[i, : len(ex.target)])) == ex.label)
        inputs.append(x.double().cpu().numpy())
    return np.concatenate(inputs), np.array(right, dtype=bool)


def fit_act_head(net: nn.Module, x: np.ndarray, right: np.ndarray, seed: int) -> dict[str, Any]:
    """Set `net.act_head` in place to the best abstain signal the fitting answers support; returns the
    record of what was chosen and why (every candidate's out-of-fold figures).

    With too few right or wrong answers to fit anything, the head still becomes the top-probability
    head (with a default slope and intercept): it ranks as the top probability does, where the source's
    untrained head reads ~1.0 everywhere."""
    first, last = net.act_head[0], net.act_head[2]
    n_right, n_wrong = int(right.sum()), int((~right).sum())
    record: dict[str, Any] = {"target": "softmax(act)[0] = P(the decision is right)", "answers": len(right),
                              "right": n_right, "wrong": n_wrong}
    reads, t = plain_signal(x)
    if min(n_right, n_wrong) < MIN_EACH:
        s, b = DEFAULT_TOP if reads == "top1" else (3, -4.0)
        _write(first, last, *_plain_params(x.shape[1], reads, s, b))
        record.update(fitted=False, chosen="top_probability", falls_back=True,
                      head={"reads": reads, "slope": float(2.0 ** s), "intercept": b},
                      why_not=(f"the held-out answers hold {n_right} right and {n_wrong} wrong decisions; at least "
                               f"{MIN_EACH} of each are needed to learn when the model is wrong"),
                      says="act head: the top probability (too few held-out answers to fit it)")
        return record
    mu, sigma = x.mean(0), x.std(0)
    sigma = np.where(sigma > 1e-6, sigma, 1.0)
    z = (x - mu) / sigma
    settings = {f"correction:{comps}:{l2:g}": (comps, l2) for comps, l2 in CORRECTIONS}
    gains: dict[str, list[float]] = {name: [] for name in settings}
    top_auroc: list[float] = []
    for repeat in range(REPEATS):
        folds = _folds(right, FOLDS, seed * 1000 + repeat)
        for k, test in enumerate(folds):
            train = np.concatenate([f for j, f in enumerate(folds) if j != k])
            top = _auroc(t[test], right[test])
            top_auroc.append(top)
            base = _correction_base(t[train], z[train], right[train], reads)  # shared by every correction
            for name, (comps, l2) in settings.items():
                fitted = _fit_correction(base, z[train], right[train], comps, l2)
                gains[name].append(_auroc(_logit(fitted, t[test], z[test]), right[test]) - top)
    figures = {name: {"gain": round(float(np.mean(g)), 4), "wins": round(float(np.mean(np.array(g) > 0)), 3)}
               for name, g in gains.items()}
    kept = [n for n in figures if figures[n]["gain"] >= MARGIN and figures[n]["wins"] >= WIN_SHARE]
    chosen = max(kept, key=lambda n: figures[n]["gain"]) if kept else "top_probability"
    record.update(fitted=True, chosen=chosen.split(":")[0], falls_back=not kept,
                  cv={"folds": FOLDS, "repeats": REPEATS, "seed": seed, "margin": MARGIN, "win_share": WIN_SHARE,
                      "auroc_top_probability": round(float(np.mean(top_auroc)), 4), "corrections": figures})
    best = max(figures, key=lambda n: figures[n]["gain"])
    if not kept:
        s, b = _fit_plain(t, right, T_MAX[reads])
        _write(first, last, *_plain_params(x.shape[1], reads, s, b))
        record["head"] = {"reads": reads, "slope": float(2.0 ** s), "intercept": round(b, 6)}
        record["says"] = (f"act head: falls back to the top probability (the best correction, {best}, gained "
                          f"{figures[best]['gain']:+.3f} out of fold and in {figures[best]['wins']:.0%} of the folds; "
                          f"kept only from +{MARGIN} and {WIN_SHARE:.0%})")
        return record
    comps, l2 = settings[chosen]
    fitted = _fit_correction(_correction_base(t, z, right, reads), z, right, comps, l2)
    _write(first, last, *_correction_params(fitted, mu, sigma))
    s, b = fitted["plain"]
    record["head"] = {"reads": reads, "slope": float(2.0 ** s), "intercept": round(b, 6), "cls_components": comps,
                      "l2": l2}
    record["says"] = (f"act head: the top probability corrected by the input ({chosen}: "
                      f"{figures[chosen]['gain']:+.3f} AUROC out of fold, gaining in {figures[chosen]['wins']:.0%} "
                      "of the folds)")
    return record


def plain_signal(x: np.ndarray) -> tuple[str, np.ndarray]:
    """What the top-probability head reads: top1 (column -4), or, when every answer has two options, minus
    the normalised entropy (column -2), the same ranking resolved beyond fp32 top1's rounding to 1.0."""
    if len(x) and np.allclose(x[:, -1], np.float32(2.0) / np.float32(255.0)):
        return "entropy", -x[:, -2]
    return "top1", x[:, -4]


def fit_top_probability(top1: np.ndarray, right: np.ndarray) -> tuple[int, float]:
    """The power-of-two slope 2^s and intercept b of P(right) = sigmoid(2^s * top1 - b) with the lowest
    log loss (one pseudo-answer of each kind at the median keeps b finite when top1 separates perfectly;
    2^s - b is capped at MAX_LOGIT)."""
    return _fit_plain(top1, right, T_MAX["top1"])


def _fit_plain(t: np.ndarray, right: np.ndarray, t_max: float) -> tuple[int, float]:
    """fit_top_probability for any signal t <= t_max: P(right) = sigmoid(2^s * t - b)."""
    t = np.concatenate([np.asarray(t, np.float64), np.full(2, float(np.median(t)))])
    y = np.concatenate([np.asarray(right, np.float64), [1.0, 0.0]])
    best: tuple[float, int, float] = (math.inf, 0, 0.0)
    for s in SLOPES:
        a = 2.0 ** s
        lo, hi = a * float(t.min()) - 60.0, a * t_max + 60.0  # sum(sigmoid(a t - b)) = sum(y); it falls as b grows
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _sigmoid(a * t - mid).sum() > y.sum() else (lo, mid)
        b = (lo + hi) / 2
        p = np.clip(_sigmoid(a * t - b), 1e-12, 1 - 1e-12)
        loss = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
        if loss < best[0]:
            best = (loss, s, b)
    _, s, b = best
    return s, max(b, 2.0 ** s * t_max - MAX_LOGIT)


def top_probability_state(d: int, n_act: int, s: int, b: float) -> dict[str, torch.Tensor]:
    """The act head's tensors (fp32, published names) for P(right) = sigmoid(2^s * top1 - b)."""
    first, last = nn.Linear(d + 4, 256), nn.Linear(256, n_act)
    _write(first, last, *_plain_params(d + 4, "top1", s, b))
    return {"act_head.0.weight": first.weight.detach().clone(), "act_head.0.bias": first.bias.detach().clone(),
            "act_head.2.weight": last.weight.detach().clone(), "act_head.2.bias": last.bias.detach().clone()}


# the corrections


def _correction_base(t: np.ndarray, z: np.ndarray, right: np.ndarray, reads: str) -> dict[str, Any]:
    """What every correction fitted on these answers shares: the top-probability logit (on the plain
    signal t) and the principal axes of the standardised CLS columns."""
    s, b = _fit_plain(t, right, T_MAX[reads])
    cls = z[:, :-4]
    center = cls.mean(0)
    _, sv, vt = np.linalg.svd(cls - center, full_matrices=False)
    return {"reads": reads, "plain": (s, b), "offset": 2.0 ** s * t - b, "center": center, "sv": sv, "vt": vt}


def _fit_correction(base: dict[str, Any], z: np.ndarray, right: np.ndarray, comps: int, l2: float
                    ) -> dict[str, Any]:
    """A logistic-regression correction (Newton, L2 on its weights) on `comps` principal components of the
    standardised CLS columns and the standardised features other than top1, with the top-probability
    logit of `base` (`_correction_base` of the same answers) as offset."""
    center, sv, vt = base["center"], base["sv"], base["vt"]
    cls = z[:, :-4]
    comps = min(comps, cls.shape[1], len(z) - 1)
    basis = vt[:comps].T / np.maximum(sv[:comps] / math.sqrt(len(z)), 1e-6)[None, :]  # unit-variance scores
    design = np.hstack([(cls - center) @ basis, z[:, -3:], np.ones((len(z), 1))])
    y = right.astype(np.float64)
    w = np.zeros(design.shape[1])
    penalty = np.full(design.shape[1], l2 * len(z))
    penalty[-1] = 0.0
    for _ in range(50):
        p = _sigmoid(design @ w + base["offset"])
        grad = design.T @ (p - y) + penalty * w
        hess = (design * (p * (1 - p))[:, None]).T @ design + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    direction = np.zeros(z.shape[1])  # the correction as v . z + c
    direction[:-4] = basis @ w[:comps]
    direction[-3:] = w[comps:-1]
    return {"reads": base["reads"], "plain": base["plain"], "direction": direction,
            "constant": float(w[-1] - direction[:-4] @ center)}


def _logit(fitted: dict[str, Any], t: np.ndarray, z: np.ndarray) -> np.ndarray:
    s, b = fitted["plain"]
    return 2.0 ** s * t - b + z @ fitted["direction"] + fitted["constant"]


# writing a head into the published shape: act[0] = w_act . GELU(W1 x + b1) + b_act, and every escalate
# logit w_esc . GELU(W1 x + b1) + b_esc - ln(n_act - 1), so that softmax(act)[0] = sigmoid(act[0] - escalate)

ActParams = tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, float]


def _plain_params(n_in: int, reads: str, s: int, b: float) -> ActParams:
    """sigmoid(2^s * t - b). top1: hidden unit 0 = 2048 * top1 (exact, in GELU's identity range) and
    act[0] = 2^s * top1 exactly, the intercept on the escalate side. Entropy: units 2048 H and -2048 H,
    whose GELUs differ by exactly 2048 H, give the escalate logit 2^s * H with no intercept beside it (so
    a tiny H keeps its digits), and act[0] = -b."""
    if reads == "top1":
        w1 = np.zeros((1, n_in))
        w1[0, -4] = TOP_GAIN
        return w1, np.zeros(1), np.array([2.0 ** s / TOP_GAIN]), 0.0, np.zeros(1), b
    w1 = np.zeros((2, n_in))
    w1[0, -2], w1[1, -2] = TOP_GAIN, -TOP_GAIN
    scale = 2.0 ** s / TOP_GAIN
    return w1, np.zeros(2), np.zeros(2), -b, np.array([scale, -scale]), 0.0


def _correction_params(fitted: dict[str, Any], mu: np.ndarray, sigma: np.ndarray) -> ActParams:
    """The plain head's units, and the correction v . z + c folded back to raw inputs (z = (x - mu) / sigma)
    as the pair u, -u into act[0]: GELU(u) - GELU(-u) = u."""
    s, b = fitted["plain"]
    w1, b1, w_act, b_act, w_esc, b_esc = _plain_params(len(mu), fitted["reads"], s, b)
    v = fitted["direction"] / sigma
    c = fitted["constant"] - float(v @ mu)
    return (np.vstack([w1, v[None, :], -v[None, :]]), np.concatenate([b1, [c, -c]]),
            np.concatenate([w_act, [1.0, -1.0]]), b_act, np.concatenate([w_esc, [0.0, 0.0]]), b_esc)


def _write(first: nn.Linear, last: nn.Linear, w1: np.ndarray, b1: np.ndarray, w_act: np.ndarray, b_act: float,
           w_esc: np.ndarray, b_esc: float) -> None:
    """Set the act head's tensors; hidden units beyond the first len(b1) read nothing and give nothing."""
    hidden = len(b1)
    with torch.no_grad():
        first.weight.zero_()
        first.bias.zero_()
        last.weight.zero_()
        last.bias.zero_()
        first.weight[:hidden] = torch.from_numpy(w1).float()
        first.bias[:hidden] = torch.from_numpy(b1).float()
        last.weight[0, :hidden] = torch.from_numpy(w_act).float()
        last.bias[0] = b_act
        last.weight[1:, :hidden] = torch.from_numpy(w_esc).float()[None, :]
        last.bias[1:] = b_esc - math.log(max(1, last.out_features - 1))


# helpers


def _folds(right: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """k folds, each with its share of right and of wrong answers (stratified), in a seeded order."""
    rng = np.random.default_rng(seed)
    k = max(2, min(k, int(right.sum()), int((~right).sum())))
    out: list[list[int]] = [[] for _ in range(k)]
    position = 0
    for cls in (True, False):
        for i in rng.permutation(np.flatnonzero(right == cls)):
            out[position % k].append(int(i))
            position += 1
    return [np.array(sorted(f)) for f in out]


def _auroc(score: np.ndarray, right: np.ndarray) -> float:
    value = auroc(score, right)
    return 0.5 if value is None else value


def _sigmoid(u: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * u))
