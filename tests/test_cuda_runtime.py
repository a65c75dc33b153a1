"""`runtime="cuda"` without a GPU: its code path on the CPU device (the same buckets, packing, padding and
bucket cache, the graphs replaced by eager calls), its pure bucketing and packing, the capture-once cache
with a fake capture, its refusal where torch sees no GPU, and auto putting it first where torch sees one.
What only a GPU can check (graph capture and replay, bf16 and fp16 on tensor cores, speed) is in
scripts/gpu-check.sh."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from collections.abc import Collection
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from conftest import corrupt_one_weight, load_quiet

from laya.encoder import choice
from laya.encoder.batch import Batch, collate
from laya.encoder.checkpoint import Checkpoint, load_checkpoint
from laya.encoder.gate import GateFailed
from laya.encoder.rows import Row
from laya.encoder.runtimes import buckets, cuda
from laya.encoder.runtimes.buckets import GraphCache, all_buckets, bucket_of, pack, padding_waste, token_buckets
from laya.encoder.runtimes.cuda import BucketRunner, CudaRuntime
from laya.encoder.runtimes.pytorch import TorchRuntime
from laya.encoder.runtimes.rownet import RowNet
from laya.errors import RuntimeUnavailable

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = {"c": {"type": "choice", "instructions": "Which team?",
                   "criteria": {"billing": "refunds and invoices", "shipping": "parcels", "sales": None,
                                "support": "bugs"}},
             "s": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]},
             "n": {"type": "noul", "instructions": "Is it urgent?"}}
STATES = ["refund", "the parcel is late " * 3, "my invoice is wrong and the app crashes " * 12,
          "hello " * 40 + "cancel my order", "billing " * 120]


def checkpoint_of(folder: Path) -> Checkpoint:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return load_checkpoint(folder)


def flat(response: dict) -> np.ndarray:
    return np.concatenate([np.array(list(a["probabilities"].values())) if "probabilities" in a
                           else np.array([a["noul"]]) for a in response["answers"].values()])


def rows_of(lengths: list[int], markers: list[int] | None = None, seed: int = 0) -> list[Row]:
    """Rows of these token lengths (random ids past the CLS token), each with a few option markers."""
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        k = (markers or [2 + i % 4] * len(lengths))[i]
        ids = (1, *(rng.randrange(5, 600) for _ in range(n - 1)))
        out.append(Row(ids=ids, markers=tuple(sorted(rng.sample(range(1, n), k))), qtype=i % 3, state_tokens=n,
                       state_tokens_kept=n, head_tokens=0))
    return out


def exact_length(net: RowNet, embeddings: torch.Tensor, batch: Batch) -> tuple[list[np.ndarray], np.ndarray]:
    """Each row alone at its exact length, no padding and no mask (RowNet's `keep=None`): what padding
    must not change."""
    logits, acts = [], []
    with torch.inference_mode():
        for i in range(batch.size):
            n, k = int(batch.attention_mask[i].sum()), int(batch.marker_mask[i].sum())
            emb = torch.nn.functional.embedding(torch.from_numpy(batch.input_ids[i : i + 1, :n]), embeddings).float()
            z, act = net(emb, None, torch.from_numpy(batch.marker_pos[i : i + 1, :k]),
                         torch.ones(1, k, dtype=torch.bool), torch.from_numpy(batch.qtype[i : i + 1]))
            logits.append(z[0].numpy())
            acts.append(act[0].numpy())
    return logits, np.stack(acts)


# ---------------------------------------------------------------- buckets and packing (pure functions)


def test_buckets_round_tokens_to_16_then_64_and_rows_to_powers_of_two():
    assert token_buckets(512) == [*range(16, 257, 16), 320, 384, 448, 512]
    assert token_buckets(1000)[-2:] == [960, 1000]  # a max_len off the grid is a bucket of its own
    assert token_buckets(100) == [16, 32, 48, 64, 80, 96, 100]
    assert bucket_of(1, 1) == (1, 16)
    assert bucket_of(3, 17) == (4, 32)
    assert bucket_of(5, 256) == (8, 256)
    assert bucket_of(33, 257) == (64, 320)
    assert bucket_of(64, 512) == (64, 512)
    assert bucket_of(2, 300, max_rows=48, max_len=1024) == (2, 320)
    assert bucket_of(40, 20, max_rows=48) == (48, 32)
    every = all_buckets(64, 512)
    assert len(every) == len(set(every)) == 7 * 20
    assert {r for r, _ in every} == {1, 2, 4, 8, 16, 32, 64}
    for n_rows in range(1, 65):  # every shape a batch can take is among the buckets, and the smallest that fits
        for n_tokens in (1, 15, 16, 17, 255, 256, 257, 511, 512):
            rows, tokens = bucket_of(n_rows, n_tokens)
            assert (rows, tokens) in every and rows >= n_rows and tokens >= n_tokens
            assert not any(r >= n_rows and t >= n_tokens and (r, t) != (rows, tokens) and r <= rows and t <= tokens
                           for r, t in every)
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_of(65, 10)
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_of(1, 513)


def test_packing_groups_rows_by_token_bucket_with_little_padding():
    rng = random.Random(7)
    for trial in range(200):
        lengths = [rng.randint(1, 512) for _ in range(rng.randint(1, 150))]
        passes = pack(lengths, max_rows=64, max_len=512)
        members = sorted(i for p in passes for i in p.members)
        assert members == list(range(len(lengths))), trial  # every row in exactly one pass
        for p in passes:
            assert p.members == tuple(sorted(p.members)) and 0 < len(p.members) <= p.rows <= 64
            assert {bucket_of(1, lengths[i])[1] for i in p.members} == {p.tokens}  # one token bucket a pass
            assert bucket_of(len(p.members), p.tokens) == p.key
            assert (p.rows - len(p.members)) / p.rows <= buckets.ROW_WASTE  # padded rows: at most a quarter
            if min(lengths[i] for i in p.members) >= 64:  # tokens past 64: at most a fifth padding
                assert padding_waste([p], lengths) <= 1 - 0.8 * (1 - buckets.ROW_WASTE)
    assert [(p.rows, p.tokens, p.members) for p in pack([20, 300, 18, 31, 100])] == [
        (4, 32, (0, 2, 3)), (1, 112, (4,)), (1, 320, (1,))]
    assert [(p.rows, len(p.members)) for p in pack([10] * 9)] == [(8, 8), (1, 1)]  # not 16 rows with 7 padded
    assert [(p.rows, len(p.members)) for p in pack([10] * 13)] == [(16, 13)]
    assert [(p.rows, len(p.members)) for p in pack([10] * 130)] == [(64, 64), (64, 64), (2, 2)]


def test_the_graph_cache_captures_each_bucket_once():
    allocated, captured, replays = [], [], []

    def allocate(key):
        allocated.append(key)
        return {"key": key, "inputs": None}

    def capture(key, buffers):
        captured.append(key)
        return lambda: replays.append(buffers["inputs"]) or f"out{key}"

    cache = GraphCache(allocate, capture)
    assert cache.run((4, 32), lambda b: b.update(inputs="first")) == "out(4, 32)"
    assert cache.run((4, 32), lambda b: b.update(inputs="second")) == "out(4, 32)"  # the same bucket: no capture
    assert cache.run((1, 16), lambda b: b.update(inputs="third")) == "out(1, 16)"
    assert captured == allocated == [(4, 32), (1, 16)] and cache.captures == 2
    assert replays == ["first", "second", "third"]  # each replay reads what this pass filled in
    cache.warm([(4, 32), (8, 64), (1, 16)])
    assert captured == [(4, 32), (1, 16), (8, 64)] and len(cache) == 3 and (8, 64) in cache
    with pytest.raises(KeyError, match="not captured at warm-up"):  # frozen: never a capture on a request path
        cache.run((2, 16), lambda b: None)


def test_the_runtime_captures_a_bucket_once_and_warm_up_captures_them_all(checkpoint_dir):
    ck = checkpoint_of(checkpoint_dir)
    lazy = CudaRuntime(ck, device="cpu", warm=False)
    assert lazy.runner.cache.captures == 0
    batch = collate(rows_of([20, 30, 18, 100, 40]), ck.tokenizer.pad_id)
    lazy.forward(batch)
    keys = {p.key for p in pack([20, 30, 18, 100, 40], 64, ck.config.max_len)}
    assert lazy.runner.cache.captures == len(keys) == 3 and all(k in lazy.runner.cache for k in keys)
    lazy.forward(collate(rows_of([25, 31, 17, 97, 44], seed=1), ck.tokenizer.pad_id))  # the same buckets
    assert lazy.runner.cache.captures == 3
    warm = CudaRuntime(ck, device="cpu")
    every = all_buckets(64, ck.config.max_len)
    assert warm.runner.cache.captures == len(every) and warm.runner.cache.frozen
    warm.forward(batch)
    assert warm.runner.cache.captures == len(every)
    details = warm.details()
    assert details["graphs"] is False and details["device"] == "cpu" and details["captured"] == len(every)


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize("flavour", ["checkpoint_dir", "mmbert_dir"])
def test_fp32_answers_within_1e4_of_the_reference(flavour, request):
    folder = request.getfixturevalue(flavour)
    reference = load_quiet(folder, "torch")
    model = load_quiet(folder, "cuda", device="cpu")
    assert (model.runtime.name, model.runtime.precision, model.runtime.gate) == ("cuda", "fp32", None)
    worst = 0.0
    for state, together in zip(STATES, model.predict_batch(STATES, QUESTIONS)):
        want = reference.predict(state, QUESTIONS)
        for got in (model.predict(state, QUESTIONS), together):
            assert got["usage"] == want["usage"]
            worst = max(worst, float(np.max(np.abs(flat(got) - flat(want)))))
    assert worst <= 1e-4, worst
    # the raw outputs too, on rows padded to every kind of bucket (the reference pads to the longest)
    ck = model.checkpoint
    batch = collate(rows_of([5, 16, 17, 60, 200, ck.config.max_len]), ck.tokenizer.pad_id)
    (z, act), (z_ref, act_ref) = model.runtime.forward(batch), TorchRuntime(ck).forward(batch)
    assert z.dtype == act.dtype == np.float32 and z.shape == z_ref.shape and act.shape == act_ref.shape
    assert np.array_equal(z <= -1e4 + 1, z_ref <= -1e4 + 1)  # the same masked slots
    assert np.max(np.abs(z - z_ref)) <= 1e-3 and np.max(np.abs(act - act_ref)) <= 1e-3


def test_padding_changes_no_answer(mmbert_dir):
    """A row's answer alone, inside a batch of longer rows, and at its exact length with no padding at all
    agree within 1e-5: padded tokens are masked, padded rows are discarded."""
    ck = checkpoint_of(mmbert_dir)
    runtime = CudaRuntime(ck, device="cpu")
    lengths = [17, 30, 31, 3, 100, 250, 33, 17]  # 17 and 30: one 32-token pass with 4 rows, one of them padding
    rows = rows_of(lengths, markers=[2, 5, 3, 1, 4, 6, 2, 3])
    together = collate(rows, ck.tokenizer.pad_id)
    z, act = runtime.forward(together)
    exact_z, exact_act = exact_length(runtime.runner.net, runtime.embeddings, together)
    for i, row in enumerate(rows):
        alone_z, alone_act = runtime.forward(collate([row], ck.tokenizer.pad_id))
        k = len(row.markers)
        for got, got_act in ((z[i], act[i]), (alone_z[0], alone_act[0])):
            assert np.max(np.abs(got[:k] - exact_z[i])) <= 1e-5, (i, lengths[i])
            assert np.max(np.abs(got_act - exact_act[i])) <= 1e-5, (i, lengths[i])
            assert np.all(got[k:] == -1e4)


def test_more_options_than_slots_run_eagerly_with_the_same_answers(checkpoint_dir):
    ck = checkpoint_of(checkpoint_dir)
    runtime = CudaRuntime(ck, device="cpu", warm=False)
    few = BucketRunner(runtime.runner.net, runtime.embeddings, ck.config.n_act, 64, ck.config.max_len, graphs=False,
                       slots=3)
    batch = collate(rows_of([40, 50, 90], markers=[6, 2, 5]), ck.tokenizer.pad_id)
    (z, act), (z_few, act_few) = runtime.forward(batch), few.forward(batch)
    assert few.cache.captures == 0  # nothing captured for a shape outside the buckets
    assert np.max(np.abs(z - z_few)) <= 1e-5 and np.max(np.abs(act - act_few)) <= 1e-5


# ---------------------------------------------------------------- refusals and the gate


def test_without_a_gpu_cuda_is_refused_saying_why(monkeypatch, checkpoint_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeUnavailable, match=r"needs an NVIDIA GPU.*is_available\(\) is False.*device='cpu'"):
        load_quiet(checkpoint_dir, "cuda")
    with pytest.raises(RuntimeUnavailable, match="needs an NVIDIA GPU"):
        load_quiet(checkpoint_dir, "cuda", device="cuda:0", precision="bf16")
    with pytest.raises(RuntimeUnavailable, match="CUDA graphs need a CUDA device"):
        load_quiet(checkpoint_dir, "cuda", device="cpu", graphs=True)
    with pytest.raises(RuntimeUnavailable, match="cuda precision must be one of fp32, bf16, fp16"):
        load_quiet(checkpoint_dir, "cuda", device="cpu", precision="int8")
    with pytest.raises(RuntimeUnavailable, match="not 'mps'"):
        load_quiet(checkpoint_dir, "cuda", device="mps")


def test_fp32_on_a_gpu_turns_tf32_off():
    """TF32 rounds fp32 products to 10-bit fractions (~1e-3 in probability): off wherever cuda loads on a GPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        cuda.exact_fp32()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.slow
def test_reduced_precision_is_gated_like_packed(monkeypatch, checkpoint_dir):
    """bf16 (on the CPU device here) answers only through the precision standard's gate: within 0.05 of
    the reference where it passes; a drifting network is refused, forced past it only by force=True."""
    reference = load_quiet(checkpoint_dir, "torch")
    model = load_quiet(checkpoint_dir, "cuda", device="cpu", precision="bf16")
    gate = model.runtime.gate
    assert gate["passed"] and gate["precision"] == "bf16" and gate["plan"].startswith("bf16 projections")
    for state in STATES[:3]:
        assert np.max(np.abs(flat(model.predict(state, QUESTIONS)) - flat(reference.predict(state, QUESTIONS)))) \
            <= 0.05
    corrupt_one_weight(monkeypatch, cuda)
    monkeypatch.setattr(cuda, "REVISION", -1)  # not the record cached above
    with pytest.raises(GateFailed, match=r"cuda bf16 failed its accuracy gate.*max \|dp\|") as refused:
        load_quiet(checkpoint_dir, "cuda", device="cpu", precision="bf16")
    assert not refused.value.gate["passed"]
    forced = load_quiet(checkpoint_dir, "cuda", device="cpu", precision="bf16", force=True)
    assert forced.runtime.plan.fp32_layers == 1 and not forced.runtime.gate["passed"]


# ---------------------------------------------------------------- auto


def picks(monkeypatch: pytest.MonkeyPatch, checkpoint_dir: Path, capability: tuple[int, int], available: bool = True,
          gate_fails: Collection[tuple[str, str]] = (), **options: Any) -> tuple[list[tuple[str, dict]], choice.Choice]:
    """What auto builds first (a fake build: nothing runs) where torch reports this GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    built = []

    def build(name, checkpoint, opts):
        built.append((name, dict(opts)))
        if (name, opts.get("precision")) in gate_fails:
            raise GateFailed(f"{name} {opts.get('precision')} failed its accuracy gate", {"passed": False})
        return SimpleNamespace(name=name, precision=opts.get("precision", "fp32"))

    runtime, chosen = choice.choose(checkpoint_of(checkpoint_dir), {"measure": False, **options}, build)
    return built, chosen


def test_auto_picks_cuda_first_where_torch_sees_a_gpu(monkeypatch, checkpoint_dir):
    built, chosen = picks(monkeypatch, checkpoint_dir, (9, 0), threads=2)
    assert built[0] == ("cuda", {"precision": "bf16", "threads": 2})
    assert (chosen.runtime, chosen.options) == ("cuda", {"precision": "bf16"}) and "compute capability 9.0" in \
        chosen.reason
    built, chosen = picks(monkeypatch, checkpoint_dir, (7, 5))  # no bf16 tensor cores: fp32
    assert built == [("cuda", {"precision": "fp32"})] and chosen.options == {"precision": "fp32"}
    built, chosen = picks(monkeypatch, checkpoint_dir, (8, 0), precision="fp32")  # the exact path only
    assert built == [("cuda", {"precision": "fp32"})]
    built, chosen = picks(monkeypatch, checkpoint_dir, (8, 6), gate_fails={("cuda", "bf16")})
    assert [b[1]["precision"] for b in built] == ["bf16", "fp32"] and chosen.options == {"precision": "fp32"}
    assert chosen.passed_over[0].startswith("cuda bf16 (cuda bf16 failed its accuracy gate")


def test_auto_without_cuda_is_unchanged(monkeypatch, checkpoint_dir):
    assert picks(monkeypatch, checkpoint_dir, (9, 0), available=False)[0][0][0] != "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choice.cuda_candidates() == []
    fixed = [c.label for c in choice.candidates(checkpoint_of(checkpoint_dir))]
    assert not any(label.startswith("cuda") for label in fixed)


# ---------------------------------------------------------------- the benchmark and the GPU check


def test_the_gpu_benchmark_runs_on_the_cpu_and_writes_its_record(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
                           "--json", str(out), "--upstream-venv", str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["benchmark"] == "gpu" and record["device"]["type"] == "cpu" and record["quick"] is True
    assert record["upstream"]["status"] == "not carried"
    assert {s["shape"] for s in record["shapes"]} == {"quick-base", "quick-large"}
    for shape in record["shapes"]:
        assert {r["label"] for r in shape["runtimes"]} >= {"cuda fp32"}
        for r in shape["runtimes"]:
            assert {s["scenario"] for s in r["scenarios"]} == {"1 question of 4 options, 128 tokens",
                                                              "1 question of 4 options, 512 tokens"}
            for s in r["scenarios"]:
                assert 0 < s["forward_p50_ms"] <= s["forward_p99_ms"] and s["tokens"] > 0
            assert r["batch"]["rows"] == 64 and r["batch"]["decisions_per_s"] > 0
    lines = done.stdout.rstrip().splitlines()
    table = lines[max(i for i, line in enumerate(lines) if "decisions/s (64 rows)" in line):]
    assert [line.split()[:2] for line in table[1:]] == [  # the table is printed last
        ["quick-base", "cuda"], ["quick-base", "upstream"], ["quick-large", "cuda"], ["quick-large", "upstream"]]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu

    markdown = gpu.render(record)
    assert markdown[0].startswith("### laya's cuda runtime on ") and any("| quick-large | cuda fp32 |" in line
                                                                          for line in markdown)


def test_the_gpu_check_refuses_to_run_without_a_gpu():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                                                      "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode != 0
    assert "no CUDA device" in done.stderr
