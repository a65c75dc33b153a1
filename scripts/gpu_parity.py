"""The GPU half of `runtime="cuda"`'s parity, run by scripts/gpu-check.sh on a machine with an NVIDIA GPU.

    python scripts/gpu_parity.py [--device cuda] [--skip-base]

What the CPU test suite cannot check (tests/test_cuda_runtime.py runs the same code on the CPU device):
1. the golden cases (tests/golden/answers.json, upstream laya 0.4.15's answers) on the GPU in fp32, bf16
   and fp16, every bucket captured as a CUDA graph at load: the same input tokens, probabilities within
   the precision's bound (fp32 1e-4, bf16 0.05, fp16 0.02), no flipped top answer (for a reduced
   precision: none where upstream's top two are more than twice the bound apart);
2. a generated checkpoint of the full mmBERT-base shape against the CPU reference (runtime="torch") on
   rows of about 30, 130 and 330 tokens, alone and batched, at the same bounds;
3. graph replay against the same passes run eagerly on the GPU, capture-once after warm-up, and a row
   alone against the same row inside a batch of longer ones (fp32: within 1e-5).
A reduced precision whose gate refuses it is reported, and its forced run compared all the same. Any
failure is printed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from laya.encoder.model import Model

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
BOUNDS = {"fp32": 1e-4, "bf16": 0.05, "fp16": 0.02}
BASE = dict(flavour="mmbert", hidden_size=768, num_layers=22, num_heads=12, intermediate_size=1152, local_attention=128,
            max_len=512, head_max_len=256, vocab_size=256000, seed=3, attention_logit_std=1.0, scorer_gain=1.0)
BASE_QUESTIONS = {"c": {"type": "choice", "instructions": "Which team?",
                        "criteria": ["billing", "shipping", "sales", "support"]},
                  "s": {"type": "score", "instructions": "How angry is the customer?",
                        "criteria": ["calm", "annoyed", "angry", "furious"]},
                  "n": {"type": "noul", "instructions": "Is it urgent?"}}
failures: list[str] = []


def probs(answer: dict[str, Any]) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1.0 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def compare(got: dict[str, Any], want: dict[str, Any], precision: str, where: str) -> float:
    """The largest |dp| of one response; a failure is recorded past the bound or on a flip."""
    bound, worst = BOUNDS[precision], 0.0
    if got["usage"]["input_tokens"] != want["usage"]["input_tokens"]:
        failures.append(f"{where}: {got['usage']['input_tokens']} input tokens, want {want['usage']['input_tokens']}")
    for qid, expected in want["answers"].items():
        g, w = probs(got["answers"][qid]), probs(expected)
        dp = float(np.max(np.abs(g - w)))
        worst = max(worst, dp)
        top = np.sort(w)[::-1]
        margin = top[0] - top[1] if len(top) > 1 else 1.0
        if dp > bound:
            failures.append(f"{where} {qid}: max |dp| {dp:.2e} > {bound}")
        if (precision == "fp32" or margin > 2 * bound) and int(np.argmax(g)) != int(np.argmax(w)):
            failures.append(f"{where} {qid}: top answer flipped (margin {margin:.3g})")
    return worst


def load(folder: Path, precision: str, device: str, **options: Any) -> tuple[Model, str]:
    """The cuda runtime at `precision`; a gate refusal is reported and the forced run returned."""
    import laya
    from laya.encoder.gate import GateFailed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return laya.load(folder, runtime="cuda", precision=precision, device=device, **options), ""
        except GateFailed as exc:
            note = f" [gate refused it: {str(exc).splitlines()[0][:160]}; forced run compared]"
            return laya.load(folder, runtime="cuda", precision=precision, device=device, force=True, **options), note


def goldens(device: str, precisions: list[str]) -> None:
    from laya.errors import QuestionError

    record = json.loads((GOLDEN / "answers.json").read_text(encoding="utf-8"))
    for precision in precisions:
        for name, rel in record["checkpoints"].items():
            started = time.perf_counter()
            model, note = load(GOLDEN / rel, precision, device)  # every bucket captured at load
            worst, compared = 0.0, 0
            for case in record["cases"]:
                if case["checkpoint"] != name or "error" in case:
                    continue
                try:
                    got = model.predict(case["state"], case["questions"])
                except QuestionError:  # refused by laya's contract (tests/test_parity.py checks which)
                    continue
                where = f"golden {precision} {name}:{case['id']}"
                worst = max(worst, compare(got, case["response"], precision, where))
                compared += 1
            details = model.runtime.details()
            print(f"golden {precision:4s} {name:10s}: {compared} cases, max |dp| {worst:.2e} "
                  f"(bound {BOUNDS[precision]}), {details['captured']} graphs captured in {details['warm_s']} s, "
                  f"{time.perf_counter() - started:.1f} s{note}", flush=True)


def graph_checks(model: Model, device: str) -> None:
    """Graph replay equals the eager passes; nothing is captured after warm-up; padding changes nothing."""
    from laya.encoder.batch import collate
    from laya.encoder.runtimes.cuda import BucketRunner

    runtime = model.runtime
    tok = model.tokenizer
    rows = [r for s in ("refund " * n + "late parcel" for n in (3, 40, 150, 400))
            for r in model.prepare([s], BASE_QUESTIONS).rows[0]]
    batch = collate(rows, tok.pad_id)
    before = runtime.runner.cache.captures
    z, act = runtime.forward(batch)
    eager = BucketRunner(runtime.runner.net, runtime.embeddings, model.checkpoint.config.n_act, runtime.max_rows,
                         model.checkpoint.config.max_len, graphs=False)
    z_eager, act_eager = eager.forward(batch)
    dz = max(float(np.max(np.abs(z - z_eager))), float(np.max(np.abs(act - act_eager))))
    if dz > 1e-6:
        failures.append(f"graph replay differs from the eager passes by {dz:.2e}")
    alone = max(float(np.max(np.abs(runtime.forward(collate([r], tok.pad_id))[0][0, : len(r.markers)]
                                    - z[i, : len(r.markers)]))) for i, r in enumerate(rows))
    if alone > 1e-5:
        failures.append(f"a row alone differs from the same row in a batch of longer ones by {alone:.2e}")
    if runtime.graphs and runtime.runner.cache.captures != before:
        failures.append(f"{runtime.runner.cache.captures - before} captures on the request path after warm-up")
    print(f"graphs: replay vs eager {dz:.2e}, alone vs batched {alone:.2e}, {runtime.runner.cache.captures} "
          f"captures ({before} at warm-up)", flush=True)


def base_shape(device: str, precisions: list[str]) -> None:
    import laya
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        started = time.perf_counter()
        folder = write_test_checkpoint(Path(tmp) / "mmbert-base", TestCheckpointSpec(**BASE))
        reference = laya.load(folder, runtime="torch")  # the CPU reference
        states = ["refund " * n + "the parcel is late" for n in (10, 100, 300)]
        wanted = [reference.predict(s, BASE_QUESTIONS) for s in states]
        print(f"base shape: generated and answered on the CPU reference in {time.perf_counter() - started:.1f} s",
              flush=True)
        del reference
        for precision in precisions:
            started = time.perf_counter()
            model, note = load(folder, precision, device)
            worst = 0.0
            batched = model.predict_batch(states, BASE_QUESTIONS)
            for state, want, together in zip(states, wanted, batched):
                worst = max(worst, compare(model.predict(state, BASE_QUESTIONS), want, precision, f"base {precision}"),
                            compare(together, want, precision, f"base {precision} batched"))
            gate = model.runtime.gate
            print(f"base   {precision:4s}: max |dp| {worst:.2e} (bound {BOUNDS[precision]}), "
                  f"{model.runtime.details()['plan']}, warm-up {model.runtime.warm_s} s, "
                  f"{time.perf_counter() - started:.1f} s" + (f", gate max |dp| {gate['max_dp']}" if gate else "")
                  + note, flush=True)
            if precision == "fp32":
                graph_checks(model, device)
            del model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-base", action="store_true", help="the goldens only (minutes less)")
    parser.add_argument("-p", "--precision", action="append", choices=list(BOUNDS), help="default: all three")
    args = parser.parse_args()
    started = time.perf_counter()
    precisions = args.precision or list(BOUNDS)
    goldens(args.device, precisions)
    if not args.skip_base:
        base_shape(args.device, precisions)
    if failures:
        print(f"\ngpu parity FAILED ({len(failures)}):", *failures[:50], sep="\n  ", file=sys.stderr)
        return 1
    print(f"gpu parity passed in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
