"""`runtime="auto"` measures: at the first load it times its faithful candidates, keeps the fastest
that beats torch fp32, stores the pick per checkpoint, processor and library versions, and says what
it measured. No test sees another's picks (their gate records and compiled programs are shared), each
runs on a processor with bf16 units with only torch installed as far as auto can see: torch fp32 and
packed bf16 are its candidates, which a tiny checkpoint loads and times in about a second (once
compiled: the session's first load compiles the packed program). Timing figures are never asserted, only what is
done with them (fake timings decide the winner rule, a fake clock the budget)."""

from __future__ import annotations

import itertools
import json
import logging
import shutil

import httpx
import pytest
import torch
from conftest import corrupt_one_weight, load_quiet
from live_server import LiveServer

from laya.cli import main
from laya.encoder import bench, choice
from laya.encoder.runtimes import base, packed
from laya.encoder.upgrade import BACKGROUND_ENV
from laya.errors import RuntimeUnavailable
from laya.native import cpu as hardware
from laya.native.cpu import Cpu

LENGTHS = (16, 48)  # instead of 128 / 512: the same code, shorter rows


BF16_CPU = Cpu("auto-measures test", "x86_64", frozenset({"avx2", "avx512f", "avx512_bf16"}))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("auto-measures-cache")


def on_cpu(monkeypatch, fake: Cpu) -> None:
    for module in (choice, packed, hardware):
        monkeypatch.setattr(module, "cpu", lambda: fake)


@pytest.fixture
def machine(monkeypatch, cache):
    """A cache without picks (the bf16 gate records are shared: measuring one costs seconds here), a
    processor with bf16 units, torch the only runtime installed, short rows, and auto measuring;
    torch's thread count restored afterwards (loads here run on one thread, which a shared machine
    slows least)."""
    shutil.rmtree(cache / "picks", ignore_errors=True)
    monkeypatch.setenv("LAYA_CACHE", str(cache))
    monkeypatch.setenv(choice.MEASURE_ENV, "1")
    monkeypatch.setenv(choice.BUDGET_ENV, "1")
    monkeypatch.setenv(BACKGROUND_ENV, "0")  # the pick itself, made at the load (tests/test_upgrade.py: deferred)
    on_cpu(monkeypatch, BF16_CPU)
    monkeypatch.setattr(base, "available_runtimes", lambda: ["torch"])
    monkeypatch.setattr(choice, "ROW_LENGTHS", LENGTHS)
    threads = torch.get_num_threads()
    yield BF16_CPU
    torch.set_num_threads(threads)


def load_auto(path, **options):
    return load_quiet(path, "auto", threads=1, **options)


def no_timing(*args, **kwargs):
    raise AssertionError("auto timed its candidates again")


def test_the_first_load_times_the_candidates_and_stores_the_pick(machine, checkpoint_dir, caplog):
    caplog.set_level(logging.INFO, logger="laya")
    model = load_auto(checkpoint_dir)
    measured = model.choice.measured
    assert measured["by"] == "auto" and measured["lengths"] == list(LENGTHS)
    assert list(measured["medians_ms"]) == ["torch fp32", "packed bf16"]  # the reference is always timed
    assert all(len(v) == 2 and min(v) > 0 for v in measured["medians_ms"].values())
    assert measured["vs_reference"]["torch fp32"] == 1.0 and measured["repeats"] >= 1
    # what ran is what the measurement says won: bf16 only if it was faster than fp32
    won = "packed bf16" if measured["vs_reference"]["packed bf16"] < 1 else "torch fp32"
    assert f"{model.runtime.name} {model.runtime.precision}" == won
    for label, values in measured["medians_ms"].items():  # the reason names the figures
        assert f"{label} {choice._ms(values)} ms" in model.choice.reason
    assert "picked at this first load on this machine: " in model.choice.reason

    record = json.loads(choice.pick_path(model.checkpoint.fingerprint, machine).read_text())
    assert (record["runtime"], record["options"]) == (model.choice.runtime, model.choice.options)
    assert record["versions"] == choice.library_versions() and record["versions"]["torch"] == torch.__version__
    assert record["measured"]["medians_ms"] == measured["medians_ms"]

    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto: timing ")]
    assert progress[0].startswith("auto: timing torch fp32, packed bf16 on 16/48-token rows")
    assert any(p.startswith("auto: timing torch fp32 on 16/48-token rows ... ") and p.endswith("(the reference)")
               for p in progress)
    assert any(p.startswith("auto: timing packed bf16 on 16/48-token rows ... ") for p in progress)


def test_a_second_load_uses_the_pick_without_timing(machine, checkpoint_dir, monkeypatch):
    first = load_auto(checkpoint_dir)
    monkeypatch.setattr(bench, "time_rows", no_timing)
    second = load_auto(checkpoint_dir)
    assert (second.runtime.name, second.runtime.precision) == (first.runtime.name, first.runtime.precision)
    assert "picked when auto first loaded it on this machine" in second.choice.reason
    assert second.choice.measured["medians_ms"] == first.choice.measured["medians_ms"]
    for label, values in first.choice.measured["medians_ms"].items():
        assert f"{label} {choice._ms(values)} ms" in second.choice.reason


def test_other_library_versions_are_timed_again(machine, checkpoint_dir, monkeypatch):
    load_auto(checkpoint_dir)
    timed = []
    real_time_rows, real_versions = bench.time_rows, choice.library_versions

    def counting(*args, **kwargs):
        timed.append(1)
        return real_time_rows(*args, **kwargs)

    monkeypatch.setattr(bench, "time_rows", counting)
    load_auto(checkpoint_dir)
    assert not timed  # same versions: the stored pick
    monkeypatch.setattr(choice, "library_versions", lambda: {**real_versions(), "onnxruntime": "0.0-another"})
    fingerprint = load_quiet(checkpoint_dir).checkpoint.fingerprint
    assert choice.stored_pick(fingerprint, machine) is None
    model = load_auto(checkpoint_dir)
    assert timed == [1] and "at this first load" in model.choice.reason
    assert json.loads(choice.pick_path(fingerprint, machine).read_text())["versions"]["onnxruntime"] == "0.0-another"


@pytest.mark.parametrize("how", ["env", "option"])
def test_measuring_off_follows_the_fixed_rule(how, machine, checkpoint_dir, monkeypatch):
    monkeypatch.setattr(bench, "time_rows", no_timing)
    if how == "env":
        monkeypatch.setenv(choice.MEASURE_ENV, "0")
        model = load_auto(checkpoint_dir)
    else:
        model = load_auto(checkpoint_dir, measure=False)
    # the rule on a processor with bf16 units: packed bf16, its gate passing
    assert (model.runtime.name, model.runtime.precision) == ("packed", "bf16")
    assert "this CPU has bf16 units" in model.choice.reason and model.choice.measured is None
    assert not choice.pick_path(model.checkpoint.fingerprint, machine).exists()


def test_measure_takes_a_bool(machine, checkpoint_dir):
    with pytest.raises(RuntimeUnavailable, match="measure takes True or False"):
        load_auto(checkpoint_dir, measure="yes")


def faked(medians: dict[str, list[float]]):
    """`time_rows` reporting these medians (ms) for the candidates it is given."""
    def time_rows(models, lengths, budget_s, max_repeats=9):
        assert list(models) == list(medians)
        return bench.Timed(lengths=list(lengths), tokens=list(lengths),
                           medians={k: [v / 1000 for v in medians[k]] for k in models}, repeats=3, planned=3,
                           elapsed_s=0.5, budget_s=budget_s)
    return time_rows


@pytest.mark.parametrize(("bf16", "winner"), [
    ([10.0, 40.0], "torch fp32"),  # a tie goes to the reference
    ([5.0, 20.0], "packed bf16"),
    ([5.0, 90.0], "torch fp32"),  # faster on short rows, slower overall (geometric mean 1.06)
    ([11.0, 30.0], "packed bf16"),  # slower on short rows, faster overall (0.91)
])
def test_a_candidate_wins_only_if_faster_than_torch_fp32(bf16, winner, machine, checkpoint_dir, monkeypatch):
    monkeypatch.setattr(bench, "time_rows", faked({"torch fp32": [10.0, 40.0], "packed bf16": bf16}))
    model = load_auto(checkpoint_dir)
    assert f"{model.runtime.name} {model.runtime.precision}" == winner, model.choice.reason
    ratio = model.choice.measured["vs_reference"]["packed bf16"]
    assert ratio == pytest.approx(((bf16[0] / 10) * (bf16[1] / 40)) ** 0.5, abs=1e-4)
    assert ("none was faster than torch fp32" in model.choice.reason) == (winner == "torch fp32")


class Clock:
    """A fake `bench.clock`: each reading advances it, by `fast` for the first `n_fast` readings and by
    `slow` after (a forward that becomes slow once the warm-up is done)."""

    def __init__(self, fast: float, slow: float, n_fast: int):
        self.now, self.steps = 0.0, itertools.chain(itertools.repeat(fast, n_fast), itertools.repeat(slow))

    def __call__(self) -> float:
        self.now += next(self.steps)
        return self.now


def test_the_budget_stops_the_timing_early(machine, checkpoint_dir, monkeypatch):
    model = load_quiet(checkpoint_dir, "torch", threads=1)
    models = {"a": model, "b": model}
    # the warm-up (8 readings) looks fast, so the budget plans the most repeats; they turn out slow
    monkeypatch.setattr(bench, "clock", Clock(0.01, 1.0, 8))
    timed = bench.time_rows(models, [16, 48], budget_s=3.0)
    assert (timed.planned, timed.repeats) == (9, 1) and timed.over_budget
    # a warm-up that spends the whole budget still gets its one timed repeat
    monkeypatch.setattr(bench, "clock", Clock(30.0, 30.0, 0))
    timed = bench.time_rows(models, [16, 48], budget_s=3.0)
    assert (timed.planned, timed.repeats) == (1, 1) and timed.over_budget
    assert all(len(v) == 2 for v in timed.medians.values())
    # through auto: it stops, says so in the reason, and still picks
    monkeypatch.setattr(bench, "clock", Clock(0.01, 1.0, 8))
    auto = load_auto(checkpoint_dir)
    assert "stopped after 1 of 9 repeats: over the 1 s budget" in auto.choice.reason
    assert auto.choice.measured["over_budget"] and auto.choice.measured["budget_s"] == 1.0


def test_a_round_on_a_busy_machine_is_timed_again(machine, checkpoint_dir, monkeypatch):
    model = load_quiet(checkpoint_dir, "torch", threads=1)
    # the yardstick: quick at first, then three times slower around the first timed round (a busy machine)
    readings = iter([1.0, 1.0, 3.0] + [1.0] * 100)
    monkeypatch.setattr(bench, "reference_product", lambda: next(readings))
    monkeypatch.setattr(bench, "clock", Clock(0.01, 0.01, 0))
    timed = bench.time_rows({"a": model, "b": model}, [16, 48], budget_s=3.0, max_repeats=2)
    assert (timed.redone, timed.repeats, timed.busy_kept) == (1, 2, 0)
    assert all(len(v) == 2 for v in timed.medians.values())
    # busy throughout, with no budget left to time again: the round is kept, and counted as busy
    monkeypatch.setattr(bench, "reference_product", iter([1.0] + [3.0] * 100).__next__)
    monkeypatch.setattr(bench, "clock", Clock(30.0, 30.0, 0))
    timed = bench.time_rows({"a": model, "b": model}, [16, 48], budget_s=3.0)
    assert (timed.redone, timed.repeats, timed.busy_kept) == (0, 1, 1)


def test_a_candidate_whose_gate_fails_is_not_timed(machine, checkpoint_dir, monkeypatch):
    on_cpu(monkeypatch, Cpu("auto-measures test, bf16 corrupted", "x86_64", machine.flags))  # a gate of its own
    corrupt_one_weight(monkeypatch, packed)
    timed: list[list[str]] = []
    real = bench.time_rows
    monkeypatch.setattr(bench, "time_rows", lambda models, *a, **k: timed.append(list(models)) or real(models, *a, **k))
    model = load_auto(checkpoint_dir)
    assert all("packed bf16" not in labels for labels in timed)
    assert (model.runtime.name, model.runtime.precision) == ("torch", "fp32")
    assert "failed its accuracy gate" in model.choice.measured["not_timed"]["packed bf16"]
    assert any(p.startswith("packed bf16 (packed bf16 failed its accuracy gate") for p in model.choice.passed_over)
    assert "not timed: packed bf16" in model.choice.reason


@pytest.mark.parametrize("bf16_drifts", [False, True])
def test_packed_int8_is_timed_only_where_packed_bf16_fails(bf16_drifts, machine, checkpoint_dir, monkeypatch):
    """On a processor with bf16 and int8 units, packed int8 (half bf16's speed where both answer) is
    gated and timed at a first load only where packed bf16's gate fails, and then it is timed."""
    flags = machine.flags | {"avx512_vnni"}
    on_cpu(monkeypatch, Cpu(f"auto-measures test, int8 units, bf16 drifting {bf16_drifts}", "x86_64", flags))
    real = packed.RowNet

    def drifting(checkpoint, plan):
        net = real(checkpoint, plan)
        if bf16_drifts and plan.matmul == "bf16":
            with torch.no_grad():
                net.layers[-1].Wo_mlp.weight[0, 0] = 300.0
        return net

    monkeypatch.setattr(packed, "RowNet", drifting)
    monkeypatch.setattr(packed, "compiler_problem", lambda: "eager in this test")  # no minute of compiling
    model = load_auto(checkpoint_dir)
    not_timed = model.choice.measured["not_timed"]
    if bf16_drifts:
        assert "failed its accuracy gate" in not_timed["packed bf16"]
        assert "packed int8" in model.choice.measured["medians_ms"] and "packed int8" not in not_timed
    else:
        assert not_timed["packed int8"] == "packed bf16 passed its gate here, and is faster where both pass"
        assert "packed bf16" in model.choice.measured["medians_ms"]


def test_auto_never_exports_int8_itself(machine, checkpoint_dir, monkeypatch, cache):
    """int8's export and gate take minutes on a full-size checkpoint: the first load's bounded timing
    leaves it out (saying why) unless a bundle is in the cache already, and exports none."""
    monkeypatch.setattr(base, "available_runtimes", lambda: ["torch", "onnx"])
    monkeypatch.setattr(bench, "pick_candidates", lambda force=False, machine=None: ["torch", "onnx:int8"])
    model = load_auto(checkpoint_dir)
    assert "onnx int8" not in model.choice.measured.get("medians_ms", {})
    assert "not exported yet" in model.choice.measured["not_timed"]["onnx int8"]
    assert not list(cache.glob("onnx/*-int8-*"))


def test_a_bench_pick_is_used_by_measuring_auto(machine, checkpoint_dir, monkeypatch, capsys):
    assert main(["bench", str(checkpoint_dir), "--pick", "-r", "torch", "--threads", "1", "--lengths", "16",
                 "--questions", "--repeats", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"processor    {machine.describe()}\n") and "avx512_bf16" in out.splitlines()[0]
    monkeypatch.setattr(bench, "time_rows", no_timing)
    model = load_auto(checkpoint_dir)
    assert (model.runtime.name, model.runtime.precision) == ("torch", "fp32")
    assert "laya bench --pick" in model.choice.reason
    assert model.choice.measurement()["medians_ms"]["torch fp32"] and "results" not in model.choice.measurement()


def test_info_and_health_show_the_measurement(machine, checkpoint_dir, capsys):
    from laya.encoder.engine import EncoderEngine
    from laya.server.app import create_app

    assert main(["info", str(checkpoint_dir), "--threads", "1"]) == 0  # measures (LAYA_AUTO_MEASURE=1 here)
    out = capsys.readouterr().out
    measured = [line for line in out.splitlines() if line.startswith("measured ")]
    assert measured and "torch fp32" in measured[0] and "ms on 16/48-token rows" in measured[0]
    assert ("auto chose torch fp32" in out or "auto chose packed bf16" in out) and "picked at this first load" in out
    assert main(["info", str(checkpoint_dir), "--threads", "1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    medians = info["runtime_choice"]["measured"]["medians_ms"]
    assert set(medians) == {"torch fp32", "packed bf16"}

    model = load_auto(checkpoint_dir)
    with LiveServer(create_app(lambda: [EncoderEngine(model)])) as live:
        health = httpx.get(live.url + "/health", timeout=10).json()
    entry = health["models"][model.name]
    assert entry["runtime_measured"]["medians_ms"] == medians
    assert "torch fp32" in entry["runtime_choice"] and " ms" in entry["runtime_choice"]
    assert EncoderEngine(load_quiet(checkpoint_dir, "torch")).describe().get("runtime_measured") is None


def test_rows_are_capped_by_the_checkpoint_and_the_processor_is_described(checkpoint_dir):
    ck = load_quiet(checkpoint_dir).checkpoint  # max_len 256
    assert choice.row_lengths(ck) == [128, 256]
    amx = Cpu("Some Xeon", "x86_64", frozenset({"avx2", "avx512f", "amx_bf16", "amx_int8", "avx512_vnni"}))
    text = amx.describe()
    assert text.startswith("Some Xeon (x86_64): avx2 avx512f amx_bf16 amx_int8 avx512_vnni; without ")
    assert "avx512_bf16" in text.split("without")[1] and text.endswith("bf16 units: amx_bf16")
    assert Cpu("old", "x86_64", frozenset()).describe().endswith("bf16 units: none")


def test_two_generations_behind_one_model_name_are_told_apart():
    """A virtual machine may call Zen 2 and Zen 3 both "AMD EPYC" with the same flags; their CPUID family
    and model name the generation in benchmark records and keep their cached picks apart."""
    from laya.native.cpu import parse_cpuinfo

    def info(family: int, model: int) -> str:
        lines = [f"processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                 f"model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n" for n in (0, 1)]
        return "\n".join(lines)

    zen2, zen3 = parse_cpuinfo(info(23, 49)), parse_cpuinfo(info(25, 1))
    assert zen2 == ("AMD EPYC", {"fpu", "avx2", "fma"}, "family 23 model 49")
    assert zen3[2] == "family 25 model 1"
    two, three = (Cpu(name, "x86_64", frozenset(flags), generation=gen) for name, flags, gen in (zen2, zen3))
    assert two.describe().startswith("AMD EPYC (x86_64, family 23 model 49): avx2;")
    assert two.key != three.key
    assert parse_cpuinfo("Hardware\t: BCM2835\nFeatures\t: fp asimd\n") == ("BCM2835", {"fp", "asimd"}, "")
