"""Smaller students against their teacher: agreement on held-out routing states, and speed under `auto`.

    .venv/bin/python benchmarks/student.py [--layers 6 --layers 4] [--work DIR] [--repeats 7]
        [--json benchmarks/results/student-KIND.json]

Agreement: a 22-layer teacher trained from chance on the routing task of `laya.testing.routing_task` (the
mmBERT layout: global attention every third layer, 22 layers, at width 128, which this machine trains in
minutes; the full width's training from chance takes hours on two cores), and each student made by
`laya distill --student-layers N` from it (its own checkpoint the student's start) on states neither
trained on. Reported per student: the teacher's layers it kept and, on held-out states, top-1 agreement
with the teacher (per question), max and mean |dp|, ECE against the teacher and the act head's AUROC at
telling disagreement; and the teacher's accuracy on its own held-out labelled lines.

Speed: the full mmBERT-base shape (22 layers, d 768, a 256k vocabulary, conditioned random weights as in
benchmarks/vs_upstream.py: speed depends on the shape, not on what the weights learned) and its students
cut to the same depths; medians of `Model.predict` under `auto` (each pick made before timing, not in the
background), timed interleaved, at 128 and 512 tokens with 1 and with 10 questions, with each student's
speed-up over the teacher. `--work DIR` keeps the checkpoints, so a second run only times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TEACHER_LINES, STATES = 2000, 3000
# the routing teacher: the mmBERT layout at width 128, each layer a modest update of the residual stream
# (as in a pretrained encoder); trained as tests/test_train.py trains its router (fp32, two threads)
TEACHER_SPEC = dict(flavour="mmbert", seed=3, num_layers=22, hidden_size=128, num_heads=2, intermediate_size=128,
                    residual_gain=0.25)
TEACHER_TRAINING = dict(epochs=10, encoder_lr=3e-4, head_lr=1e-3, batch_size=8, holdout=0.3, seed=0, device="cpu",
                        precision="fp32")
STUDENT_TRAINING = dict(epochs=10, encoder_lr=3e-4, head_lr=1e-3, batch_size=8, holdout=0.3, seed=0, device="cpu",
                        precision="fp32")


def teacher(work: Path, threads: int) -> tuple[Path, dict[str, Any]]:
    """The 22-layer router trained on the routing task (kept in `work`)."""
    import laya
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
    from laya.testing.routing_task import routing_lines, write_jsonl

    out = work / "teacher"
    report_path = out / "report" / "benchmark-train.json"
    if not report_path.is_file():
        source = write_test_checkpoint(work / "source", TestCheckpointSpec(**TEACHER_SPEC))
        data = write_jsonl(work / "routing.jsonl", routing_lines(TEACHER_LINES, seed=11))
        started = time.perf_counter()
        report = laya.train(source, data, out, quiet=False, plots=False, threads=threads, **TEACHER_TRAINING)
        report["seconds"] = round(time.perf_counter() - started, 1)
        report_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return out, json.loads(report_path.read_text(encoding="utf-8"))


def student(work: Path, teacher_dir: Path, layers: int, threads: int) -> tuple[Path, dict[str, Any]]:
    """`laya distill --student-layers layers` from the teacher on fresh states (kept in `work`)."""
    from laya.apps import distill
    from laya.testing.routing_task import QUESTION, routing_lines

    out = work / f"student-{layers}"
    report_path = out / "report" / distill.REPORT
    if not (out / "model.safetensors").is_file():
        states = work / "states.jsonl"
        states.write_text("".join(json.dumps(line["state"]) + "\n" for line in routing_lines(STATES, seed=23)),
                          encoding="utf-8")
        started = time.perf_counter()
        report = distill.distill(teacher_dir, teacher_dir, states, QUESTION, out, threads=threads,
                                 student_layers=layers, progress=True, **STUDENT_TRAINING)
        report["seconds"] = round(time.perf_counter() - started, 1)
        report_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return out, json.loads(report_path.read_text(encoding="utf-8"))


def full_shape(work: Path, layers: list[int]) -> dict[str, Path]:
    """The full mmBERT-base shape and its students cut to `layers` (for speed; kept in `work`)."""
    from vs_upstream import CONDITIONED, SHAPES

    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint
    from laya.training.shrink import shrink

    folder = work / "full"
    if not (folder / "model.safetensors").is_file():
        write_test_checkpoint(folder, TestCheckpointSpec(**SHAPES["base"], **CONDITIONED))
    cut = {}
    for n in layers:
        cut[f"student-{n}"] = work / f"full-{n}"
        if not (cut[f"student-{n}"] / "model.safetensors").is_file():
            shrink(folder, n, cut[f"student-{n}"])
    return {"teacher": folder, **cut}


def time_models(models: dict[str, Any], repeats: int, warmup: int) -> list[dict[str, Any]]:
    from laya.encoder.bench import scenarios

    first = models["teacher"]
    plan = scenarios(first, [128, 512], [], 0) + scenarios(first, [], [10], 128) + scenarios(first, [], [10], 512)
    out = []
    for sc in plan:
        tokens = sum(len(r.ids) for r in first.prepare([sc.state], sc.questions).rows[0])
        times: dict[str, list[float]] = {name: [] for name in models}
        for rep in range(warmup + repeats):
            for name, model in models.items():
                started = time.perf_counter()
                model.predict(sc.state, sc.questions)
                if rep >= warmup:
                    times[name].append((time.perf_counter() - started) * 1000)
        medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
        out.append({"scenario": sc.name, "tokens": tokens, "questions": len(sc.questions), "medians_ms": medians,
                    "speedup_over_teacher": {k: round(medians["teacher"] / v, 2) for k, v in medians.items()}})
        print(f"  {sc.name}: " + ", ".join(f"{k} {v} ms" for k, v in medians.items()), flush=True)
    return out


def agreement(report: dict[str, Any]) -> dict[str, Any]:
    h = report["heldout"]
    return {"kept_layers": report["kept_layers"], "heldout_answers": h["answers"], "agreement": h["agreement"],
            "agreement_by_question": h["agreement_by_question"], "max_abs_dp": h["max_abs_dp"],
            "mean_abs_dp": h["mean_abs_dp"], "ece_vs_teacher": h["ece_vs_teacher"], "act_auroc": h["act_auroc"],
            "distill_s": report.get("seconds")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, action="append", help="student depths (default: 6 and 4)")
    parser.add_argument("--distill-layers", type=int, action="append",
                        help="the depths distilled for agreement (default: every --layers depth)")
    parser.add_argument("--work", type=Path, help="keep the teacher and students here (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the record here (for benchmarks/performance_doc.py)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch
    from vs_upstream import describe_runtime, processor_kind, write_record

    import laya
    from laya.native.cpu import cpu

    torch.set_num_threads(args.threads)
    layers = args.layers or [6, 4]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        teacher_dir, teacher_report = teacher(work, args.threads)
        students = {n: student(work, teacher_dir, n, args.threads) for n in args.distill_layers or layers}
        models = {}
        for name, folder in full_shape(work, layers).items():
            started = time.perf_counter()
            models[name] = laya.load(folder, runtime="auto", threads=args.threads, background=False)
            print(f"loaded {name} in {time.perf_counter() - started:.1f} s: {models[name].choice.describe()}",
                  flush=True)
        results = time_models(models, args.repeats, args.warmup)
        # what auto says names the checkpoints' folders: kept by their names only
        runtimes = json.loads(json.dumps({name: describe_runtime(m) for name, m in models.items()})
                              .replace(str(work) + "/", ""))
    machine = cpu()
    record = {
        "benchmark": "student",
        "command": "python benchmarks/student.py " + shlex.join(_without_work(sys.argv[1:])),
        "date": datetime.date.today().isoformat(),
        "processor": {"model": machine.model, "kind": processor_kind(machine), "described": machine.describe()},
        "threads": args.threads, "versions": {"torch": torch.__version__, "laya": laya.__version__},
        "teacher": {"spec": TEACHER_SPEC, "heldout_accuracy": teacher_report["heldout"]["after"].get("accuracy"),
                    "training_s": teacher_report.get("seconds")},
        "students": {f"student-{n}": agreement(report) for n, (_, report) in students.items()},
        "runtimes": runtimes, "scenarios": results}
    print(json.dumps({k: record[k] for k in ("teacher", "students")}, indent=2))
    if args.json:
        write_record(args.json, record)


def _without_work(args: list[str]) -> list[str]:
    """The command as the document shows it: `--work DIR` only keeps what a run made, and names a folder of
    this machine."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--work":
            skip = True
        elif not arg.startswith("--work="):
            out.append(arg)
    return out


if __name__ == "__main__":
    main()
