"""`fit_act_head` on synthetic act-head inputs (no training, a second or two): it keeps a learned head only
where the input carries what the top probability does not, and otherwise falls back to a head that ranks
answers exactly as the top probability does, in the published shape and in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from laya.calibration.metrics import auroc
from laya.encoder.runtimes.pytorch import act_features
from laya.training.act import MARGIN, WIN_SHARE, fit_act_head, fit_top_probability, top_probability_state
from laya.training.loop import pick_precision
from laya.training.run import FP32_TENSORS

D = 24  # CLS width of the synthetic inputs


class ActOnly(nn.Module):
    """Just the act head of a DecisionNet, with its names and shape."""

    def __init__(self, d: int = D, n_act: int = 2):
        super().__init__()
        self.act_head = nn.Sequential(nn.Linear(d + 4, 256), nn.GELU(), nn.Linear(256, n_act))


def synthetic(n: int, seed: int, cls_signal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Act-head inputs of `n` four-option answers, whether each is right, and the hidden group.

    The CLS columns are large (like real head activations) and random; with `cls_signal`, one of them
    also carries a group (30% of answers) whose decisions are right only 38% of the time whatever the
    top probability says. Without it, whether an answer is right depends on its top probability only."""
    rng = np.random.default_rng(seed)
    z = torch.from_numpy(rng.normal(0, 1, (n, 4)) * rng.uniform(0.3, 4.0, (n, 1))).float()
    feats = torch.stack([act_features(row) for row in z]).double().numpy()
    group = rng.random(n) < 0.3
    cls = rng.normal(0, 1, (n, D)) * 800 + 3000
    logit = 6.0 * feats[:, 0] - 3.0
    if cls_signal:
        cls[:, 5] += np.where(group, 4000.0, 0.0)
        logit = np.where(group, -0.5, logit + 1.0)
    right = rng.random(n) < 1 / (1 + np.exp(-logit))
    return np.hstack([cls, feats]), right, group


def act_probability(net: ActOnly, x: np.ndarray) -> np.ndarray:
    """softmax(act)[0] row by row, in fp32, as the reference runtime computes it."""
    with torch.no_grad():
        xt = torch.from_numpy(x).float()
        act = torch.cat([net.act_head(xt[i][None]) for i in range(len(xt))])
    return torch.softmax(act.double(), -1)[:, 0].numpy()


def test_a_learned_head_is_kept_where_the_cls_vector_tells_what_the_top_probability_does_not():
    x, right, _ = synthetic(600, seed=1, cls_signal=True)
    net = ActOnly()
    record = fit_act_head(net, x, right, seed=0)
    assert record["fitted"] and not record["falls_back"] and record["chosen"] == "correction", record
    kept = record["cv"]["corrections"][f"correction:{record['head']['cls_components']}:{record['head']['l2']:g}"]
    assert kept["gain"] >= MARGIN and kept["wins"] >= WIN_SHARE
    assert record["says"].startswith("act head: the top probability corrected by the input")
    test_x, test_right, _ = synthetic(2000, seed=2, cls_signal=True)
    learned, top = auroc(act_probability(net, test_x), test_right), auroc(test_x[:, -4], test_right)
    assert learned >= top + 0.05, (learned, top)


def test_where_the_cls_vector_is_noise_the_head_falls_back_and_ranks_exactly_as_the_top_probability():
    x, right, _ = synthetic(600, seed=3, cls_signal=False)
    net = ActOnly()
    record = fit_act_head(net, x, right, seed=0)
    assert record["fitted"] and record["falls_back"] and record["chosen"] == "top_probability", record
    assert record["says"].startswith("act head: falls back to the top probability")
    test_x, test_right, _ = synthetic(2000, seed=4, cls_signal=False)
    p = act_probability(net, test_x)
    top1 = test_x[:, -4]
    assert len(np.unique(top1)) == len(top1)
    assert np.array_equal(np.argsort(p, kind="stable"), np.argsort(top1, kind="stable"))
    assert len(np.unique(p)) == len(p)  # strictly increasing: no two answers merged
    assert auroc(p, test_right) == auroc(top1, test_right)
    # and it is a sensible P(right): its mean is the share of right answers, within a few points
    assert abs(p.mean() - test_right.mean()) < 0.03


def test_neighbouring_top_probabilities_stay_apart():
    """Every fp32 value of top1 next to each other, near 1 where confident answers crowd: the fallback
    keeps them in order, none merged (a non-power-of-two scale in fp32 would merge some)."""
    net = ActOnly()
    state = top_probability_state(D, 2, s=4, b=9.0)
    net.load_state_dict(state)
    top1 = np.nextafter(np.float32(1.0), np.float32(0.0)) - np.arange(400, dtype=np.float32) * np.float32(2 ** -24)
    top1 = np.concatenate([top1, np.float32(0.5) + np.arange(200, dtype=np.float32) * np.float32(2 ** -24)])
    x = np.zeros((len(top1), D + 4))
    x[:, :D] = 1e4
    x[:, -4] = top1
    p = act_probability(net, x)
    assert len(np.unique(p)) == len(p)
    assert np.array_equal(np.argsort(p), np.argsort(top1))


def test_the_fallback_head_round_trips_through_the_fp32_act_head_tensors():
    x, right, _ = synthetic(400, seed=5, cls_signal=False)
    net = ActOnly()
    record = fit_act_head(net, x, right, seed=0)
    assert record["falls_back"]
    assert all(name.startswith(FP32_TENSORS) for name in net.state_dict())
    saved = {k: v.detach().float().numpy().astype(np.float32) for k, v in net.state_dict().items()}
    again = ActOnly()
    again.load_state_dict({k: torch.from_numpy(v) for k, v in saved.items()})
    assert np.array_equal(act_probability(net, x), act_probability(again, x))
    s, b = fit_top_probability(x[:, -4], right)
    want = 1 / (1 + np.exp(-(2.0 ** s * x[:, -4].astype(np.float32).astype(np.float64) - np.float32(b))))
    assert np.allclose(act_probability(again, x), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("signal", [True, False])
def test_with_more_act_outputs_class_0_is_act_and_the_rest_escalate(signal):
    """act_costs give more than two act outputs: the rest share the escalate mass, P(right) is the same."""
    x, right, _ = synthetic(400, seed=6, cls_signal=signal)
    p = {}
    for n_act in (2, 3):
        net = ActOnly(n_act=n_act)
        record = fit_act_head(net, x, right, seed=0)
        assert record["falls_back"] is not signal, record
        p[n_act] = act_probability(net, x)
    assert np.allclose(p[3], p[2], rtol=0, atol=1e-6)


def test_with_two_options_the_fallback_reads_the_entropy_and_keeps_confident_answers_apart():
    """Two-option answers whose logit gap often exceeds 17, where fp32 top1 rounds to 1.0 and ties: the
    fallback ranks them by the entropy, for two options the same order as the top probability, resolved
    there; its AUROC is the float64 top probability's, above the tied fp32 top1's."""
    rng = np.random.default_rng(8)
    gap = rng.uniform(0.0, 30.0, 1500)
    z = torch.from_numpy(np.stack([gap, np.zeros_like(gap)], 1)).float()
    feats = torch.stack([act_features(row) for row in z]).double().numpy()
    right = rng.random(len(gap)) < 1 / (1 + np.exp(-(0.25 * gap - 1.0)))
    x = np.hstack([rng.normal(3000, 800, (len(gap), D)), feats])
    assert (feats[:, 0] == 1.0).mean() > 0.3  # saturated in fp32
    net = ActOnly()
    record = fit_act_head(net, x, right, seed=0)
    assert record["falls_back"] and record["head"]["reads"] == "entropy", record
    p = act_probability(net, x)
    top64 = 1 / (1 + np.exp(-z[:, 0].double().numpy()))  # the top probability in float64, untempered
    assert np.array_equal(np.argsort(p, kind="stable"), np.argsort(-x[:, -2], kind="stable"))
    assert auroc(p, right) == auroc(top64, right) > auroc(feats[:, 0], right)


def test_too_few_wrong_answers_still_give_the_top_probability_head():
    x, right, _ = synthetic(200, seed=7, cls_signal=False)
    right[:] = True
    right[:3] = False
    net = ActOnly()
    record = fit_act_head(net, x, right, seed=0)
    assert not record["fitted"] and record["falls_back"] and "at least 5" in record["why_not"]
    p = act_probability(net, x)
    assert np.array_equal(np.argsort(p, kind="stable"), np.argsort(x[:, -4], kind="stable"))


def test_cpu_training_is_fp32_unless_bf16_is_asked_for():
    """Whatever the processor's bf16 units (AMX, AVX512-BF16): the same precision, so the same result."""
    cpu = torch.device("cpu")
    assert pick_precision(cpu, "auto") is None
    assert pick_precision(cpu, "fp32") is None
    assert pick_precision(cpu, "bf16") is torch.bfloat16
