"""The packed runtime's reduced precisions and `runtime="auto"`: the gate that keeps a fast precision
honest (the precision standard, laya/encoder/gate.py), rows that answer the same in any batch, and the choice
that says why."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import GOLDEN, corrupt_one_weight, load_quiet

import laya
from laya.cli import main
from laya.encoder import choice
from laya.encoder.gate import PROMISED, GateFailed
from laya.encoder.runtimes import packed, rownet
from laya.errors import RuntimeUnavailable
from laya.native.cpu import Cpu
from laya.native.cpu import cpu as real_cpu

QUESTIONS = {"t": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "refunds", "sales": None}},
             "u": {"type": "noul", "instructions": "Urgent?"}}
PLAIN = Cpu("test cpu without bf16", "x86_64", frozenset({"avx2", "fma"}))
STATES = ["refund please", "the app crashes " * 20, "hello", "I want to upgrade my plan and get an invoice"]


def with_bf16(name: str) -> Cpu:
    """A processor with bf16 units; each test names its own, so cached gate records are not shared."""
    return Cpu(name, "x86_64", frozenset({"avx2", "avx512f", "avx512_bf16"}))


def on_cpu(monkeypatch, machine: Cpu) -> None:
    monkeypatch.setattr(packed, "cpu", lambda: machine)
    monkeypatch.setattr(choice, "cpu", lambda: machine)


def flat(response) -> np.ndarray:
    return np.concatenate([np.array(list(a["probabilities"].values())) if "probabilities" in a
                           else np.array([a["noul"]]) for a in response["answers"].values()])


def test_bf16_is_refused_on_a_cpu_without_bf16_units_unless_forced(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, PLAIN)
    with pytest.raises(RuntimeUnavailable, match="no bf16 arithmetic units.*force=True"):
        load_quiet(checkpoint_dir, "packed", precision="bf16", compiled=False)
    model = load_quiet(checkpoint_dir, "packed", precision="bf16", force=True, compiled=False)
    assert model.runtime.precision == "bf16" and model.runtime.gate["passed"]
    with pytest.raises(RuntimeUnavailable, match="precision must be one of"):
        load_quiet(checkpoint_dir, "packed", precision="fp8", compiled=False)
    with pytest.raises(RuntimeUnavailable, match="the torch runtime is the fp32 reference.*runtime='packed'"):
        load_quiet(checkpoint_dir, "torch", precision="bf16")


def test_bf16_keeps_the_sensitive_parts_in_fp32(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("split"))
    net = load_quiet(checkpoint_dir, "packed", precision="bf16", compiled=False).runtime.net
    projections = [m for m in net.modules() if isinstance(m, rownet.Projection)]
    assert projections and all(m.weight.dtype == torch.bfloat16 for m in projections)
    assert all(m.bias is None or m.bias.dtype == torch.float32 for m in projections)
    rest = [p for name, p in net.named_parameters() if ".weight" not in name or "norm" in name or "." not in name]
    rest += list(net.scorer) + list(net.act) + [net.type_emb, net.emb_norm, net.final_norm]
    assert all(p.dtype == torch.float32 for p in rest if p.dtype != torch.int8)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_row_answers_the_same_alone_and_in_any_batch(monkeypatch, checkpoint_dir, precision):
    """Each row runs alone at its exact length: its answer is the same bits whatever shares its batch."""
    on_cpu(monkeypatch, with_bf16("batch-invariance"))
    fast = load_quiet(checkpoint_dir, "packed", precision=precision, force=True, compiled=False)
    mixed = STATES + ["x", "a much longer state about billing and refunds " * 9]
    batched = fast.predict_batch(mixed, QUESTIONS)
    for state, together in zip(mixed, batched):
        assert np.array_equal(flat(together), flat(fast.predict(state, QUESTIONS)))
    assert fast.runtime.precision == "fp32" or fast.runtime.gate["batch_dependence_max_dp"] == 0.0


def test_the_compiled_program_answers_as_the_network_within_its_bound(monkeypatch):
    """The program TorchInductor compiles (cached for the test session; on a golden checkpoint, whose
    program the parity suite's packed-bf16 target loads too): within the standard of the reference, the
    same bits alone and batched, and its gate measured on what it runs."""
    on_cpu(monkeypatch, with_bf16("compiled"))
    folder = GOLDEN / "checkpoints" / "modernbert"
    reference = load_quiet(folder, "torch")
    fast = load_quiet(folder, "packed", precision="bf16", compiled=True)
    assert fast.runtime.compiled and fast.runtime.details()["compiled"] is True
    assert fast.runtime.gate["passed"] and fast.runtime.gate["batch_dependence_max_dp"] == 0.0
    for state, together in zip(STATES, fast.predict_batch(STATES, QUESTIONS)):
        alone = flat(fast.predict(state, QUESTIONS))
        assert np.max(np.abs(alone - flat(reference.predict(state, QUESTIONS)))) <= PROMISED["bf16"].max_dp
        assert np.array_equal(flat(together), alone)


def test_int8_in_two_levels_is_near_fp32_where_one_level_is_not():
    """An int8 projection is the three int8 products of two levels (hi, and what hi leaves): with an
    outlier channel in the activation (its one scale is the row's largest magnitude) it stays within a
    fraction of bf16's error, where the hi level alone is many times worse."""
    torch.manual_seed(0)
    w, x = torch.randn(96, 64) / 8, torch.randn(1, 12, 64)
    x[..., 5] *= 20
    exact = x.double() @ w.double().T
    scale = exact.abs().max()
    two = (rownet.Projection(w, None, "int8")(x).double() - exact).abs().max() / scale
    (hi, step), _ = rownet.int8_levels(w, 1)
    x_step = x.abs().max() / 127
    one = ((torch.round(x / x_step) * x_step).double() @ (hi.double() * step.double()).T - exact).abs().max() / scale
    bf16 = (rownet.Projection(w, None, "bf16")(x).double() - exact).abs().max() / scale
    assert two < bf16 / 2 and one > 10 * two, (two, bf16, one)


def test_compiled_int8_runs_on_the_int8_units_as_the_network_does(monkeypatch, checkpoint_dir):
    """TorchInductor turns the two levels into oneDNN's int8 products with an fp32 output (where it did
    not, the program would dequantise every weight on every call: 8x slower than bf16), and on a processor
    with int8 dot-product units the program answers as the eager network (attention in fp32 here, as on
    a processor without bf16 units: bf16 attention rounds differently once fused). Where this processor
    has none (AVX2 alone), oneDNN adds each pair of int8 products in 16 bits, which saturate: the compiled
    gate sees the drift and refuses the program, and the runtime refuses int8 there unless forced."""
    import zipfile

    from laya.encoder.runtimes.compiled import programs_root

    on_cpu(monkeypatch, Cpu("int8 units without bf16", "x86_64", frozenset({"avx2", "avx512f", "avx512_vnni"})))
    eager = load_quiet(checkpoint_dir, "packed", precision="int8", force=True, compiled=False)
    fast = load_quiet(checkpoint_dir, "packed", precision="int8", force=True, compiled=True)
    assert fast.runtime.compiled and fast.runtime.plan == eager.runtime.plan
    assert fast.runtime.plan.describe().startswith("int8 (two-level) projections")
    program = programs_root() / f"{fast.runtime._key(fast.runtime.plan, 'program')}.pt2"
    with zipfile.ZipFile(program) as bundle:
        wrapper = "".join(bundle.read(n).decode(errors="ignore") for n in bundle.namelist()
                          if n.endswith("wrapper.cpp"))
    calls = len(re.findall(r"aoti_torch_cpu__qlinear_pointwise\w*\(", wrapper))
    # two int8 products per projection, four projections per encoder layer
    assert calls == 2 * 4 * fast.checkpoint.encoder.num_hidden_layers, calls
    if real_cpu().int8_units:
        for state in STATES:
            drift = np.max(np.abs(flat(fast.predict(state, QUESTIONS)) - flat(eager.predict(state, QUESTIONS))))
            assert drift <= 1e-4, drift
        return
    with pytest.raises(GateFailed, match="compiled, failed its accuracy gate"):
        load_quiet(checkpoint_dir, "packed", precision="int8", compiled=True)
    monkeypatch.undo()
    with pytest.raises(RuntimeUnavailable, match="no int8 dot-product units.*force=True"):
        load_quiet(checkpoint_dir, "packed", precision="int8", compiled=True)


def test_the_gate_refuses_a_drifting_bf16_model_and_auto_falls_back_saying_why(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("corrupted"))
    corrupt_one_weight(monkeypatch, packed)
    with pytest.raises(GateFailed, match=r"failed its accuracy gate.*max \|dp\|") as refused:
        load_quiet(checkpoint_dir, "packed", precision="bf16", compiled=False)
    gate = refused.value.gate
    assert not gate["passed"] and gate["max_dp"] > gate["bounds"]["max_dp"]
    assert "first 2 encoder layers in fp32" in str(refused.value)  # every plan was tried
    forced = load_quiet(checkpoint_dir, "packed", precision="bf16", force=True, compiled=False)
    assert forced.runtime.gate == gate and forced.runtime.plan.fp32_layers == 2  # the plan the refusal named

    model = load_quiet(checkpoint_dir, "auto")
    assert (model.runtime.name, model.runtime.precision) == ("onnx", "fp32")
    assert model.choice.passed_over and model.choice.passed_over[0].startswith("packed bf16 (packed bf16 failed its")
    described = model.choice.describe()
    assert "auto chose onnx fp32" in described and "passed over packed bf16" in described and "max |dp|" in described
    reference = load_quiet(checkpoint_dir, "torch").predict("refund please", QUESTIONS)
    got = model.predict("refund please", QUESTIONS)
    assert got["answers"]["t"]["probabilities"] == pytest.approx(reference["answers"]["t"]["probabilities"], abs=1e-5)


def test_the_gate_keeps_the_first_layer_in_fp32_where_that_passes(monkeypatch, checkpoint_dir):
    """A drift in the first layer only: the plan with every layer reduced fails, the one keeping the first
    layer in fp32 passes, and the runtime says which plan runs."""
    on_cpu(monkeypatch, with_bf16("first-layer"))
    real = packed.RowNet

    def first_layer_drifts(checkpoint, plan):
        net = real(checkpoint, plan)
        if plan.matmul != "fp32" and plan.fp32_layers == 0:
            with torch.no_grad():
                net.layers[0].Wo_mlp.weight[0, 0] = 300.0
        return net

    monkeypatch.setattr(packed, "RowNet", first_layer_drifts)
    model = load_quiet(checkpoint_dir, "packed", precision="bf16", compiled=False)
    assert model.runtime.plan.fp32_layers == 1 and model.runtime.gate["passed"]
    assert "the first 1 encoder layer in fp32" in model.runtime.details()["plan"]


def test_auto_chooses_bf16_where_it_passes(monkeypatch):
    """(On the golden checkpoint whose bf16 program the test above compiled.)"""
    on_cpu(monkeypatch, with_bf16("passes"))
    model = load_quiet(GOLDEN / "checkpoints" / "modernbert", "auto")
    assert (model.runtime.name, model.runtime.precision) == ("packed", "bf16")
    assert "avx512_bf16" in model.choice.reason and model.info()["gate"]["passed"]
    assert model.info()["runtime_choice"]["runtime"] == "packed"


def test_auto_keeps_to_the_exact_path_when_asked(monkeypatch, checkpoint_dir):
    on_cpu(monkeypatch, with_bf16("exact"))
    model = load_quiet(checkpoint_dir, "auto", precision="fp32")
    assert model.runtime.precision == "fp32" and model.runtime.name in ("onnx", "packed", "torch")


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

    assert labels(with_bf16("rule")) == ["packed bf16", "onnx fp32", "packed fp32", "torch fp32", "mlx"]
    assert labels(PLAIN) == ["onnx fp32", "packed fp32", "torch fp32", "mlx"]
    assert [c.label for c in choice.candidates(ck, with_bf16("rule"), exact=True)] == \
        ["onnx fp32", "packed fp32", "torch fp32", "mlx"]
    assert "no bf16 arithmetic units" in choice.candidates(ck, PLAIN)[0].why
    apple = Cpu("Apple M3", "arm64", frozenset({"feat_bf16"}), apple_silicon=True)
    assert labels(apple)[:3] == ["coreml+mlx", "mlx fp16", "packed bf16"]
    installed -= {"onnxruntime"}
    assert labels(PLAIN) == ["packed fp32", "torch fp32", "mlx"]


def test_auto_refuses_a_precision(checkpoint_dir):
    with pytest.raises(RuntimeUnavailable, match="precision='fp32' keeps it to the exact path.*name a runtime"):
        load_quiet(checkpoint_dir, "auto", precision="bf16")
    with pytest.raises(RuntimeUnavailable, match="name a runtime"):
        load_quiet(checkpoint_dir, "auto", force=True)


def test_bench_pick_is_stored_and_used_by_auto(checkpoint_dir, capsys, monkeypatch):
    on_cpu(monkeypatch, PLAIN)
    assert main(["bench", str(checkpoint_dir), "--pick", "-r", "torch", "-r", "packed:bf16", "--lengths", "32",
                 "--questions", "1", "--repeats", "2", "--warmup", "0"]) == 0
    out = capsys.readouterr()
    assert "skipped packed:bf16: packed bf16 refused" in out.err
    assert "not run: packed bf16 refused" in out.out and "(no gate: fp32 matches the reference)" in out.out
    assert "picked torch for" in out.out
    stored = choice.stored_pick(load_quiet(checkpoint_dir).checkpoint.fingerprint, PLAIN)
    assert stored["runtime"] == "torch" and stored["options"] == {"precision": "fp32"}
    model = load_quiet(checkpoint_dir, "auto")
    assert (model.runtime.name, model.runtime.precision) == ("torch", "fp32")
    assert "laya bench --pick" in model.choice.reason
    choice.pick_path(model.checkpoint.fingerprint, PLAIN).unlink()


def test_bench_pick_stores_the_fastest_faithful_runtime_never_one_forced_past_its_gate(monkeypatch):
    """Three candidates with faked timings: packed bf16, forced past a failed gate, is the fastest and is
    never stored; of the two faithful ones the faster (packed fp32) is."""
    from types import SimpleNamespace

    from laya.encoder.runtimes.base import RuntimeInfo

    def fake(precision: str, gate: dict | None) -> SimpleNamespace:
        info = RuntimeInfo("fake", precision, "cpu", gate=gate)
        return SimpleNamespace(runtime=SimpleNamespace(precision=precision, info=lambda: info), choice=None,
                               checkpoint=SimpleNamespace(fingerprint="f" * 64))

    models = {"torch": fake("fp32", None), "packed": fake("fp32", None),
              "packed:bf16": fake("bf16", {"passed": False, "max_dp": 0.2})}
    speedups = {"torch": 1.0, "packed": 1.6, "packed:bf16": 3.0}
    results = [{"runtime": spec, "scenario": s, "speedup": up * f, "median_ms": 10.0 / (up * f)}
               for spec, up in speedups.items() for s, f in (("short", 1.0), ("long", 1.1))]
    stored = {}
    monkeypatch.setattr(choice, "store_pick", lambda fingerprint, name, options, measured, **kw:
                        stored.update(name=name, options=options, measured=measured) or "the pick")
    assert choice.store_winner(models, results) == ("packed", "the pick")
    assert stored["name"] == "packed" and stored["options"] == {"precision": "fp32"}
    assert "bf16" not in stored["measured"]["summary"]


def test_the_packed_scorer_and_act_head_run_in_fp32_whatever_the_precision(checkpoint_dir):
    """bf16 reduces the encoder's products and the head's attention; the scorer and the act head read
    the same vectors as fp32 does, with fp32 arithmetic: fed the same inputs, the same logits. (The
    packed runtime's network under bf16's plan and fp32's, built directly: no gate to measure.)"""
    from laya.encoder.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(checkpoint_dir)
    nets = [rownet.RowNet(checkpoint, plan).eval() for plan in (rownet.Plan(), rownet.Plan("bf16", "bf16"))]
    generator = torch.Generator().manual_seed(7)
    markers = torch.randn(2, 5, nets[0].d, generator=generator)
    cls = torch.randn(2, nets[0].d, generator=generator)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    with torch.no_grad():
        (logits32, act32), (logits16, act16) = (net.score(markers, cls, mask) for net in nets)
    assert logits16.dtype == act16.dtype == torch.float32
    assert torch.allclose(logits16, logits32, atol=1e-6, rtol=0) and torch.allclose(act16, act32, atol=1e-6, rtol=0)


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
