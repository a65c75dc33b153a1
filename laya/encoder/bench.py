"""`laya bench`: how fast a model answers on each runtime, measured in one interleaved run.

Scenarios: one question over a row of L tokens (for each `--lengths` L), and Q questions over a
state of S tokens (for each `--questions` Q). Every repeat times each runtime in turn on the same
input, so the ratios compare like with like. Reported: medians with min/max, tokens per second,
the ratio to the first runtime, the bare graph call (`runtime.forward` on the prepared batch) and
what the whole `predict` (tokenising, rows, decoding) costs on top of it, and peak memory.
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from laya.encoder.batch import collate, padded_length
from laya.encoder.model import Model

if TYPE_CHECKING:
    from laya.native.cpu import Cpu

WORD = " refund"
clock: Callable[[], float] = time.perf_counter  # what `time_rows` reads (tests put a fake clock here)
probe_clock: Callable[[], float] = time.perf_counter  # what times the reference product (tests fake it apart)
BUSY_RATIO = 1.5  # a reference product this many times slower than its quickest: the machine is busy
BUSY_BUDGET = 3.0  # how far rounds timed again on a busy machine may stretch the timing budget


@dataclass
class Scenario:
    name: str
    state: str
    questions: dict[str, Any]
    tokens: int = 0


@dataclass
class Timing:
    predict: list[float] = field(default_factory=list)
    graph: list[float] = field(default_factory=list)


def _state_of(model: Model, n_tokens: int) -> str:
    """A state of about `n_tokens` tokens (one token per repeated word where the tokenizer allows)."""
    per_word = max(1, len(model.tokenizer.encode(WORD * 8)) // 8)
    return (WORD * max(0, n_tokens // per_word)).strip()


def scenarios(model: Model, lengths: list[int], questions: list[int], state_tokens: int) -> list[Scenario]:
    out = []
    noul = {"q": {"type": "noul", "instructions": "Does the customer want a refund?"}}
    for length in lengths:
        head = len(model.prepare(["x"], noul).rows[0][0].ids) - len(model.tokenizer.encode("x"))
        state = _state_of(model, max(0, length - head))
        out.append(Scenario(f"1 question, {length} tokens", state, noul))
    for n in questions:
        qs = {f"q{i}": {"type": "choice", "instructions": f"Which team should handle point {i}?",
                        "criteria": {"billing": "payments and refunds", "sales": "plans and pricing",
                                     "support": "technical problems", "legal": "contracts"}} for i in range(n)}
        out.append(Scenario(f"{n} questions, {state_tokens}-token state", _state_of(model, state_tokens), qs))
    return out


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(models: dict[str, Model], lengths: list[int], questions: list[int], state_tokens: int, repeats: int,
        warmup: int) -> list[dict[str, Any]]:
    first = next(iter(models.values()))
    plan = scenarios(first, lengths, questions, state_tokens)
    results = []
    for sc in plan:
        prepared = {name: m.prepare([sc.state], sc.questions) for name, m in models.items()}
        rows = next(iter(prepared.values())).rows[0]
        sc.tokens = sum(len(r.ids) for r in rows)
        timings = {name: Timing() for name in models}
        for rep in range(warmup + repeats):
            for name, model in models.items():
                rows = prepared[name].rows[0]
                batch = collate(rows, model.tokenizer.pad_id, length=padded_length(max(len(r.ids) for r in rows)))
                gc.collect()
                t0 = time.perf_counter()
                model.predict(sc.state, sc.questions)
                t1 = time.perf_counter()
                model.runtime.forward(batch)
                t2 = time.perf_counter()
                if rep >= warmup:
                    timings[name].predict.append(t1 - t0)
                    timings[name].graph.append(t2 - t1)
        base = statistics.median(timings[next(iter(models))].predict)
        for name, t in timings.items():
            med, graph = statistics.median(t.predict), statistics.median(t.graph)
            results.append({"scenario": sc.name, "runtime": name, "tokens": sc.tokens, "median_ms": med * 1000,
                            "min_ms": min(t.predict) * 1000, "max_ms": max(t.predict) * 1000,
                            "graph_ms": graph * 1000, "overhead": med / graph - 1, "tokens_per_s": sc.tokens / med,
                            "speedup": base / med})
    return results


def report(results: list[dict[str, Any]], say=print) -> None:
    say(f"{'scenario':34s} {'runtime':12s} {'tokens':>6s} {'median':>9s} {'min':>9s} {'max':>9s} {'graph':>9s} "
        f"{'+e2e':>6s} {'tok/s':>8s} {'speedup':>8s}")
    for r in results:
        say(f"{r['scenario']:34s} {r['runtime']:12s} {r['tokens']:6d} {r['median_ms']:7.1f}ms {r['min_ms']:7.1f}ms "
            f"{r['max_ms']:7.1f}ms {r['graph_ms']:7.1f}ms {r['overhead']:6.1%} {r['tokens_per_s']:8.0f} "
            f"{r['speedup']:7.2f}x")
    say(f"peak resident memory of the process: {_peak_mb():.0f} MB")


@dataclass
class Timed:
    """What `time_rows` measured: per runtime, the median seconds of each row shape, and how far it got."""

    lengths: list[int]  # the row lengths asked for
    tokens: list[int]  # the tokens of each row as built
    medians: dict[str, list[float]]  # runtime -> median seconds per shape, in the order of `lengths`
    repeats: int  # timed repeats done (after one warm-up)
    planned: int  # timed repeats the budget allowed after the warm-up
    elapsed_s: float
    budget_s: float
    redone: int = 0  # rounds timed while the machine was busy, thrown away and timed again
    busy_kept: int = 0  # rounds kept although the machine was busy (the budget allowed no other)

    @property
    def over_budget(self) -> bool:
        """The budget ran out before the planned repeats, or the warm-up alone spent it."""
        return self.repeats < self.planned or self.elapsed_s > self.budget_s


def reference_product() -> float:
    """Seconds of a fixed fp32 matrix product (256x768 by 768x768, best of three) now: a yardstick timed
    beside each round, since a round on a machine busy with other work says nothing about the runtimes."""
    import numpy as np

    a = np.ones((256, 768), dtype=np.float32)
    b = np.ones((768, 768), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = probe_clock()
        a @ b
        best = min(best, probe_clock() - t0)
    return best


def time_rows(models: dict[str, Model], lengths: list[int], budget_s: float, max_repeats: int = 9) -> Timed:
    """Time each model's `predict` on one question over a row of each length, interleaved (every repeat
    runs every model on every shape, the models' order rotating), within `budget_s`.

    This is auto's short measurement at first load (`laya.encoder.choice`), where `run` is `laya bench`'s long
    one. One warm-up round, then as many timed rounds as the budget allows at the warm-up's pace (at
    least 1, at most `max_repeats`), stopping early when a round would overrun it; medians. A round
    during which the reference product (`reference_product`, timed before and after it) ran over
    `BUSY_RATIO` times its quickest time was timed on a busy machine: it is thrown away and timed again,
    the budget stretched up to `BUSY_BUDGET` times for that; one kept anyway is counted in `busy_kept`."""
    names = list(models)
    if not names:
        raise ValueError("no model to time")
    first = models[names[0]]
    plan = scenarios(first, lengths, [], 0)
    for sc in plan:
        sc.tokens = sum(len(r.ids) for r in first.prepare([sc.state], sc.questions).rows[0])
    samples: dict[str, list[list[float]]] = {n: [[] for _ in plan] for n in names}

    def one_round(rep: int, keep: bool) -> float:
        gc.collect()
        began = clock()
        order = names[rep % len(names):] + names[: rep % len(names)]
        for i, sc in enumerate(plan):
            for name in order:
                t0 = clock()
                models[name].predict(sc.state, sc.questions)
                if keep:
                    samples[name][i].append(clock() - t0)
        return clock() - began

    quickest = reference_product()
    start = clock()
    round_s = one_round(0, keep=False)
    spent = clock() - start
    planned = max(1, min(max_repeats, int((budget_s - spent) / max(round_s, 1e-9))))
    done = redone = busy_kept = 0
    while done < planned:
        if done and clock() - start + round_s > budget_s:
            break
        before = reference_product()
        round_s = one_round(done + redone + 1, keep=True)
        after = reference_product()
        quickest = min(quickest, before, after)
        if max(before, after) > BUSY_RATIO * quickest:
            if redone < max_repeats and clock() - start + round_s <= BUSY_BUDGET * budget_s:
                for per_shape in samples.values():
                    for values in per_shape:
                        values.pop()
                redone += 1
                continue
            busy_kept += 1
        done += 1
    return Timed(lengths=list(lengths), tokens=[sc.tokens for sc in plan],
                 medians={n: [statistics.median(s) for s in samples[n]] for n in names}, repeats=done,
                 planned=planned, elapsed_s=clock() - start, budget_s=budget_s, redone=redone, busy_kept=busy_kept)


def pick_candidates(force: bool = False, machine: Cpu | None = None) -> list[str]:
    """What `laya bench --pick` times: every runtime and precision installed here that auto could run
    (torch first, the reference). The packed runtime's reduced precisions only where the processor has
    their units (bf16: AVX512-BF16, AMX or ARM BF16; int8: AMX-INT8 or VNNI), where they can pay;
    `force` times them anyway."""
    from laya.encoder.runtimes.base import available_runtimes
    from laya.native.cpu import cpu

    have, machine = set(available_runtimes()), machine or cpu()
    out = []
    if "torch" in have:
        out += ["torch", "packed"]
        if machine.bf16_units or force:
            out.append("packed:bf16")
        if machine.int8_units or force:
            out.append("packed:int8")
    if "onnx" in have:
        out += ["onnx", "onnx:int8"]
    if "llama" in have:
        out += ["llama:f32", "llama:f16", "llama:q8_0"]
    if "mlx" in have and machine.apple_silicon:
        out += ["mlx:fp16"]
    return out


def faithful(model: Model) -> bool:
    """fp32 runtimes are exact; reduced precisions only when their gate passed."""
    gate = model.runtime.info().gate
    return gate is None or bool(gate.get("passed"))


def report_gates(models: dict[str, Model], skipped: dict[str, str], say=print) -> None:
    """Each runtime's accuracy gate next to its speed: a fast answer that drifts is not a win."""
    from laya.encoder.gate import describe

    for spec, model in models.items():
        gate = model.runtime.info().gate
        how = model.choice.describe() if model.choice else ""
        if gate:
            verdict = "passed" if gate.get("passed") else "FAILED (forced)"
            say(f"gate {spec:12s} {verdict}: {describe(gate)} {how}".rstrip())
        else:
            say(f"gate {spec:12s} {model.runtime.precision} (no gate: fp32 matches the reference) {how}".rstrip())
    for spec, reason in skipped.items():
        say(f"gate {spec:12s} not run: {reason}")
