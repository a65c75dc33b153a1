"""bf16 and `runtime="auto"`: the gate that keeps a fast precision honest, and the choice that says why."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import load_quiet

import laya
from laya import choice
from laya.cli import main
from laya.encoder.runtimes import pytorch
from laya.errors import RuntimeUnavailable
from laya.gate import BOUNDS, GateFailed
from laya.hardware import Cpu

QUESTIONS = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "refunds", "sales": None}},
             "u": {"type": "noul", "instructions": "Urgent?"}}
PLAIN = Cpu("test cpu without bf16", "x86_64", frozenset({"avx2", "fma"}))


def with_bf16(name: str) -> Cpu:
    """A processor with bf16 units; each test names its own, so cached gate records are not shared."""
    return Cpu(name, "x86_64", frozenset({"avx2", "avx512f", "avx512_bf16"}))


def on_cpu(monkeypatch, machine: Cpu) -> None:
    monkeypatch.setattr(pytorch, "cpu", lambda: machine)
    monkeypatch.setattr(choice, "cpu", lambda: machine)


def test_bf16_is_refused_on_a_cpu_without_bf16_units_unless_forced(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, PLAIN)
    with pytest.raises(RuntimeUnavailable, match="no bf16 arithmetic units.*force=True"):
        load_quiet(checkpoint_dir, "torch", precision="bf16")
    model = load_quiet(checkpoint_dir, "torch", precision="bf16", force=True)
    assert model.runtime.precision == "bf16" and model.runtime.gate["passed"]
    with pytest.raises(RuntimeUnavailable, match="precision must be one of"):
        load_quiet(checkpoint_dir, "torch", precision="fp16")


def test_bf16_keeps_its_weights_in_bf16_and_the_sensitive_parts_in_fp32(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("split"))
    net = load_quiet(checkpoint_dir, "torch", precision="bf16").runtime.net
    layers = net.encoder.layers
    assert all(m.weight.dtype == torch.float32 for m in layers[0].modules() if isinstance(m, torch.nn.Linear))
    assert not any(isinstance(m, pytorch.Bf16Linear) for m in layers[0].modules())
    for layer in layers[1:]:  # values and the three other projections in bf16; queries and keys fp32
        assert [type(m) for m in (layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo)] == [pytorch.Bf16Linear] * 3
        assert isinstance(layer.attn.Wqkv, pytorch.SplitQkv) and layer.attn.Wqkv.bf16 == (False, False, True)
        fp32, bf16 = layer.attn.Wqkv.groups
        assert fp32.weight.dtype == torch.float32 and fp32.weight.shape[0] == 2 * bf16.weight.shape[0]
        assert all(m.weight.dtype == torch.bfloat16 for m in layer.modules() if isinstance(m, pytorch.Bf16Linear))
    rest = [net.encoder.embeddings, net.head, net.scorer, net.act_head, net.type_emb]
    assert all(p.dtype == torch.float32 for part in rest for p in part.parameters())
    assert all(p.dtype == torch.float32 for n, p in net.encoder.named_parameters() if "norm" in n)


def test_bf16_answers_within_its_bound_alone_and_batched(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("bound"))
    reference, fast = load_quiet(checkpoint_dir, "torch"), load_quiet(checkpoint_dir, "torch", precision="bf16")
    states = ["refund please", "the app crashes " * 20, "hello", "I want to upgrade my plan and get an invoice"]

    def flat(response):
        return np.concatenate([np.array(list(a["probabilities"].values())) if "probabilities" in a
                               else np.array([a["noul"]]) for a in response["answers"].values()])

    batched = fast.predict_batch(states, QUESTIONS)
    for state, together in zip(states, batched):
        want, alone = flat(reference.predict(state, QUESTIONS)), flat(fast.predict(state, QUESTIONS))
        assert np.max(np.abs(alone - want)) <= BOUNDS["bf16"].max_dp
        assert np.max(np.abs(flat(together) - alone)) <= BOUNDS["bf16"].batch_dependence_max_dp


def corrupt_one_weight(monkeypatch) -> None:
    """A bf16 model with one weight wrong: the kind of drift the gate exists to catch."""
    cast = pytorch.cast_bf16

    def corrupted(net):
        net = cast(net)
        with torch.no_grad():
            net.encoder.layers[-1].mlp.Wo.weight[0, 0] = 300.0
        return net

    monkeypatch.setattr(pytorch, "cast_bf16", corrupted)


def test_the_gate_refuses_a_drifting_bf16_model_and_auto_falls_back_saying_why(monkeypatch, checkpoint_dir,
                                                                               tmp_path):
    on_cpu(monkeypatch, with_bf16("corrupted"))
    corrupt_one_weight(monkeypatch)
    with pytest.raises(GateFailed, match=r"failed its accuracy gate.*max \|dp\|") as refused:
        load_quiet(checkpoint_dir, "torch", precision="bf16")
    gate = refused.value.gate
    assert not gate["passed"] and gate["max_dp"] > gate["bounds"]["max_dp"]
    forced = load_quiet(checkpoint_dir, "torch", precision="bf16", force=True)
    assert forced.runtime.gate == gate  # measured once, then read from the cache

    model = load_quiet(checkpoint_dir, "auto")
    assert (model.runtime.name, model.runtime.precision) == ("onnx", "fp32")
    assert model.choice.passed_over and model.choice.passed_over[0].startswith("torch bf16 (torch bf16 failed its")
    described = model.choice.describe()
    assert "auto chose onnx fp32" in described and "passed over torch bf16" in described and "max |dp|" in described
    reference = load_quiet(checkpoint_dir, "torch").predict("refund please", QUESTIONS)
    got = model.predict("refund please", QUESTIONS)
    assert got["answers"]["t"]["probabilities"] == pytest.approx(reference["answers"]["t"]["probabilities"], abs=1e-5)


def test_auto_chooses_bf16_where_it_passes(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("passes"))
    model = load_quiet(checkpoint_dir, "auto")
    assert (model.runtime.name, model.runtime.precision) == ("torch", "bf16")
    assert "avx512_bf16" in model.choice.reason and model.info()["gate"]["passed"]
    assert model.info()["runtime_choice"]["runtime"] == "torch"


def test_the_rule_in_order(monkeypatch, checkpoint_dir):
    import warnings

    from laya.encoder.checkpoint import load_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ck = load_checkpoint(checkpoint_dir)
    installed = {"torch", "onnxruntime", "onnx", "onnxscript", "mlx", "coremltools"}
    monkeypatch.setattr(choice, "_installed", lambda m: m in installed)

    def labels(machine):
        return [c.label for c in choice.candidates(ck, machine)]

    assert labels(with_bf16("rule")) == ["torch bf16", "onnx fp32", "torch fp32", "mlx"]
    assert labels(PLAIN) == ["onnx fp32", "torch fp32", "mlx"]
    assert "no bf16 arithmetic units" in choice.candidates(ck, PLAIN)[0].why
    apple = Cpu("Apple M3", "arm64", frozenset({"feat_bf16"}), apple_silicon=True)
    assert labels(apple)[:3] == ["coreml+mlx", "mlx fp16", "torch bf16"]
    installed -= {"onnxruntime"}
    assert labels(PLAIN) == ["torch fp32", "mlx"]


def test_auto_refuses_a_precision(checkpoint_dir):
    with pytest.raises(RuntimeUnavailable, match="name a runtime"):
        load_quiet(checkpoint_dir, "auto", precision="bf16")


def test_bench_pick_is_stored_and_used_by_auto(checkpoint_dir, capsys, monkeypatch):
    on_cpu(monkeypatch, PLAIN)
    assert main(["bench", str(checkpoint_dir), "--pick", "-r", "torch", "-r", "torch:bf16", "--lengths", "32",
                 "--questions", "1", "--repeats", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr()
    assert "skipped torch:bf16: torch bf16 refused" in out.err
    assert "not run: torch bf16 refused" in out.out and "(no gate: fp32 matches the reference)" in out.out
    assert "picked torch for" in out.out
    stored = choice.stored_pick(load_quiet(checkpoint_dir).checkpoint.fingerprint, PLAIN)
    assert stored["runtime"] == "torch" and stored["options"] == {"precision": "fp32"}
    model = load_quiet(checkpoint_dir, "auto")
    assert (model.runtime.name, model.runtime.precision) == ("torch", "fp32")
    assert "laya bench --pick" in model.choice.reason
    choice.pick_path(model.checkpoint.fingerprint, PLAIN).unlink()


def test_info_and_health_show_the_choice(checkpoint_dir, capsys, monkeypatch):
    from laya.encoder.engine import EncoderEngine

    on_cpu(monkeypatch, PLAIN)
    assert main(["info", "-m", str(checkpoint_dir)]) == 0
    out = capsys.readouterr().out
    assert "runtime      onnx (fp32)" in out and "auto chose onnx fp32" in out and "no bf16 arithmetic units" in out
    described = EncoderEngine(load_quiet(checkpoint_dir, "auto")).describe()
    assert described["runtime"] == "onnx" and described["runtime_choice"].startswith("auto chose onnx fp32")
    assert EncoderEngine(load_quiet(checkpoint_dir, "torch")).describe()["runtime_choice"] == "named by the operator"
    json.dumps(described)


def test_routed_runtime_sends_each_row_where_it_fits(checkpoint_dir):
    """The Apple route (Neural Engine programs for rows that fit, another runtime for the rest), built here
    from the Core ML torch executor: every answer equals the reference, and both routes take rows."""
    from laya.encoder.runtimes.routed import RoutedRuntime

    neural_engine = load_quiet(checkpoint_dir, "coreml", executor="torch").runtime
    reference = load_quiet(checkpoint_dir, "torch")
    routed = laya.Model(reference.checkpoint, RoutedRuntime(neural_engine, reference.runtime),
                        temperatures=reference.temperatures)
    states = ["short", "long " * 150, "medium " * 40]
    for state, got in zip(states, routed.predict_batch(states, QUESTIONS)):
        want = reference.predict(state, QUESTIONS)
        assert got["answers"]["t"]["probabilities"] == pytest.approx(want["answers"]["t"]["probabilities"],
                                                                     abs=1e-4)
        assert got["answers"]["u"]["noul"] == pytest.approx(want["answers"]["u"]["noul"], abs=1e-4)
    assert routed.runtime.routed["neural_engine"] > 0 and routed.runtime.routed["rest"] > 0
