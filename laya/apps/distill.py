"""`laya distill`: from a slow, accurate reader of the questions (the teacher) to a fast, calibrated
laya checkpoint (the student), on the user's own states, with no labels needed.

1. The teacher answers every state: a System One URL (a hosted one with its key, another `laya
   serve`) or a local model run through the project's engines (a chat GGUF on the decide engine, or a
   laya checkpoint). Its full probabilities are the soft targets. The answers are kept in
   `OUT/teacher/answers.jsonl` keyed by a hash of what was asked, so an interrupted run resumes and
   no state is asked twice (a state repeated in the file is asked once); a URL is asked with bounded
   concurrency and rate, 429/503 retried after `Retry-After` and a dropped connection retried, both a
   bounded number of times; a state the teacher refuses is recorded with its reason and left out.
2. The student is trained on them with `laya train`'s loop (soft cross-entropy; a state's own
   `labels`, when the file gives them, mixed in with `--hard-weight`), its temperatures and act
   head fitted on held-out teacher answers, so the act head learns where the student disagrees with
   the teacher.
3. The report (`OUT/report/distill.json`): on held-out states the student's agreement with the teacher
   and the KL from the teacher's answer to the student's, the student's calibration against the
   teacher's answer, the act head's AUROC at telling agreement from disagreement, what the teacher
   cost (tokens, and billing units when it reports them) and both models' milliseconds per decision
   (the teacher's as its answers took them, the student's on the held-out states): the trade the user
   buys.

`OUT` is a checkpoint in the published format, which every runtime serves.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from laya.apps import jsonl
from laya.calibration.data import DataError, Record, json_lines, label_index
from laya.calibration.metrics import auroc, ece
from laya.encoder.checkpoint import CONFIG_FILE
from laya.errors import LayaError, QuestionError
from laya.questions import check_state, parse_questions

TEACHER_DIR, ANSWERS, DATA, REPORT = "teacher", "answers.jsonl", "distill.jsonl", "distill.json"
CANDIDATE, STUDENT_INIT = ".candidate", ".student-init"  # the student trained aside, and cut before it
MAX_TIMED = 50  # held-out states the student is timed on


@dataclass(frozen=True)
class State:
    line: int
    state: Any
    labels: dict[str, Any]  # hard labels the file gives (qid -> answer), mixed into the targets


def read_states(path: str | os.PathLike, questions: Mapping[str, Any]) -> list[State]:
    """`STATES.jsonl`: each line a state (a JSON string, object or array) or `{"state": ..., "labels"?}`;
    every line checked before the teacher is asked anything."""
    parsed = {q.qid: q for q in parse_questions(questions)}
    out = []
    for number, at, data in json_lines(path):
        wrapped = isinstance(data, dict) and "state" in data
        state, labels = (data["state"], data.get("labels") or {}) if wrapped else (data, {})
        try:
            check_state(state)
        except QuestionError as exc:
            raise DataError(f"{at}: {exc}") from exc
        if not isinstance(labels, dict):
            raise DataError(f"{at}: \"labels\" must map question ids to answers")
        for qid, value in labels.items():
            if qid not in parsed:
                raise DataError(f"{at}: a label for {qid!r}, which is not one of the questions {list(parsed)}")
            try:
                label_index(parsed[qid], value)
            except ValueError as exc:
                raise DataError(f"{at}: question {qid!r}: {exc}") from exc
        out.append(State(number, state, labels))
    if not out:
        raise DataError(f"{os.fspath(path)}: no states in the file")
    return out


def key_of(state: Any, questions: Mapping[str, Any]) -> str:
    """What a teacher's answer is cached under: a hash of the state and the questions asked."""
    return hashlib.sha256(json.dumps([state, questions], sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


class Cost:
    """What the teacher's answers cost: the sums of the numeric `usage` figures it reports (tokens,
    billing units)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, response: Mapping[str, Any]) -> None:
        usage = response.get("usage")
        for key, value in (usage.items() if isinstance(usage, dict) else ()):
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.totals[key] = self.totals.get(key, 0) + value
        if isinstance(units := response.get("x_billing_units"), int | float) and not isinstance(units, bool):
            self.totals["billing_units"] = self.totals.get("billing_units", 0) + units

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in sorted(self.totals.items()))


def teacher_answer(teacher: str, *, api_key: str | None, concurrency: int, rate: float | None,
                   threads: int | None) -> tuple[jsonl.Answer, int]:
    """How the teacher is asked: a URL through `laya.apps.jsonl.remote_answer`, else a local model through
    its engine (one state at a time: its milliseconds are one decision's)."""
    from laya.apps import evaluation

    method = evaluation.parse_method(teacher)
    if method.remote:
        return jsonl.remote_answer(method.source, api_key, concurrency, timed=True, rate=rate), concurrency
    return evaluation.timed(jsonl.local_answer(evaluation.local_engine(method, threads))), 1


def collect(states: Sequence[State], questions: Mapping[str, Any], teacher: str, out: Path, *,
            api_key: str | None = None, concurrency: int = 4, rate: float | None = None, threads: int | None = None,
            progress: bool = True, model: str | None = None) -> tuple[dict[str, dict[str, Any]], Cost]:
    """The teacher's outcome for every distinct state (by `key_of`), asking only what is not kept."""
    folder = out / TEACHER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ANSWERS
    distinct: dict[str, State] = {}
    for s in states:
        distinct.setdefault(key_of(s.state, questions), s)
    cost = Cost()
    kept = {k: o for k, o in jsonl.outcomes(path).items() if not transient(o)}
    _rewrite(path, kept)  # a state the teacher could not answer for a while (503, unreachable) is asked again
    for outcome in kept.values():
        if "response" in outcome:
            cost.add(outcome["response"])
    todo = [(k, s) for k, s in distinct.items() if k not in kept]
    if todo:
        answer, chunk = teacher_answer(teacher, api_key=api_key, concurrency=concurrency, rate=rate, threads=threads)

        def counted(lines: list[jsonl.Line]) -> list[dict[str, Any]]:
            outcomes = answer(lines)
            for o in outcomes:
                if "response" in o:
                    cost.add(o["response"])
            return outcomes

        body = {"questions": questions, **({"model": model} if model else {})}
        lines = (jsonl.Line(s.line, k, {"state": s.state, **body}) for k, s in todo)
        try:
            jsonl.run(lines, path, counted, total=len(todo), chunk=chunk, progress=progress,
                      note=lambda: f"teacher cost: {cost}" if cost.totals else "")
        finally:
            getattr(answer, "close", lambda: None)()
    found = jsonl.outcomes(path)
    return {k: found[k] for k in distinct if k in found and not transient(found[k])}, cost


def transient(outcome: Mapping[str, Any]) -> bool:
    """An outcome that says nothing about the state: the teacher was unreachable, overloaded or failed
    (5xx, or 429 past its retries). A 4xx is the teacher's refusal of the state, kept."""
    error = outcome.get("error")
    return isinstance(error, dict) and (int(error.get("status", 500)) >= 500 or error.get("status") == 429)


def _rewrite(path: Path, kept: Mapping[str, dict[str, Any]]) -> None:
    if not path.is_file():
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(o, ensure_ascii=False) + "\n" for o in kept.values()), encoding="utf-8")
    os.replace(tmp, path)


def distribution(q: Any, answer: Mapping[str, Any]) -> list[float]:
    """A teacher's answer as a distribution over the question's options, in their order."""
    if q.qtype == "noul":
        p = min(1.0, max(0.0, float(answer["noul"])))
        return [1.0 - p, p]
    given = answer["probabilities"]
    values = [max(0.0, float(given.get(k, 0.0))) for k in q.keys]
    total = sum(values)
    if not total > 0:
        raise ValueError("the teacher's probabilities are all 0")
    return [v / total for v in values]


def targets(states: Sequence[State], questions: Mapping[str, Any], outcomes: Mapping[str, dict[str, Any]],
            hard_weight: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training lines (`"gold"`: the teacher's distributions, a given label mixed in with
    `hard_weight`), and the refusals (state line, reason) left out."""
    parsed = parse_questions(questions)
    lines, refused = [], []
    for s in states:
        outcome = outcomes.get(key_of(s.state, questions))
        if outcome is None or "response" not in outcome:
            reason = (outcome or {}).get("error", {"message": "not answered"})
            refused.append({"line": s.line, "error": reason})
            continue
        gold = {}
        try:
            for q in parsed:
                p = distribution(q, outcome["response"]["answers"][q.qid])
                if q.qid in s.labels:
                    hard = [0.0] * q.n_options
                    hard[label_index(q, s.labels[q.qid])] = 1.0
                    p = [(1 - hard_weight) * a + hard_weight * b for a, b in zip(p, hard)]
                gold[q.qid] = p
        except (KeyError, TypeError, ValueError) as exc:
            refused.append({"line": s.line, "error": {"message": f"the teacher's answer cannot be read ({exc})"}})
            continue
        lines.append({"state": s.state, "questions": questions, "gold": gold, "line": s.line})
    return lines, refused


def write_data(lines: Sequence[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps({k: v for k, v in line.items() if k != "line"}, ensure_ascii=False) + "\n")
    return path


def held_out(records: Sequence[Record], holdout: float, seed: int) -> list[Record]:
    """The records `laya train` measures on (the second half of its held-out part): never trained on,
    nor fitted on."""
    from laya.calibration.run import split

    _, held = split(len(records), holdout, seed)
    _, report_pos = split(len(held), 0.5, seed + 1) if len(held) >= 2 else ([], [])
    return [records[held[i]] for i in report_pos]


def compare(student: Any, records: Sequence[Record]) -> dict[str, Any]:
    """The student against the teacher on `records` (whose `soft` targets are the teacher's): top-1
    agreement (overall and per question), |dp| over every option, KL(teacher || student), the student's
    calibration against the teacher's answer, and the act head's AUROC at telling agreement from
    disagreement."""
    agree, kl, top, act, dp = [], [], [], [], []
    per_question: dict[str, list[bool]] = {}
    answers = student.predict_batch([r.state for r in records], records[0].questions) if records else []
    for record, response in zip(records, answers):
        for q in record.parsed:
            if q.qid not in record.soft:
                continue
            a = response["answers"][q.qid]
            p = np.array([1 - a["noul"], a["noul"]] if q.qtype == "noul" else [a["probabilities"][k] for k in q.keys])
            t = np.array(record.soft[q.qid])
            agree.append(int(np.argmax(p)) == int(np.argmax(t)))
            per_question.setdefault(q.qid, []).append(agree[-1])
            dp.extend(np.abs(p - t).tolist())
            kl.append(float(np.sum(np.where(t > 0, t * (np.log(np.maximum(t, 1e-12)) - np.log(np.maximum(p, 1e-12))),
                                            0.0))))
            top.append(float(np.max(p)))
            act.append(a.get("x_act_probability", math.nan))
    agree_a, top_a, act_a = np.array(agree, dtype=bool), np.array(top), np.array(act, dtype=float)
    return {"answers": len(agree), "agreement": float(agree_a.mean()) if agree else math.nan,
            "agreement_by_question": {qid: float(np.mean(v)) for qid, v in per_question.items()},
            "max_abs_dp": float(np.max(dp)) if dp else math.nan, "mean_abs_dp": float(np.mean(dp)) if dp else math.nan,
            "kl": float(np.mean(kl)) if kl else math.nan, "ece_vs_teacher": ece(top_a, agree_a),
            "act_auroc": auroc(act_a, agree_a) if np.isfinite(act_a).all() else None,
            "top_probability_auroc": auroc(top_a, agree_a)}


def short_of(heldout: Mapping[str, Any], min_agreement: float | None) -> dict[str, float]:
    """The questions whose held-out agreement with the teacher is below `min_agreement` (none when unset;
    with no held-out answer to measure, the bound is not reached)."""
    if min_agreement is None:
        return {}
    if not heldout["answers"]:
        return {"(no held-out states)": math.nan}
    return {qid: a for qid, a in heldout["agreement_by_question"].items() if not a >= min_agreement}


def timings(outcomes: Mapping[str, dict[str, Any]], student: Any, states: Sequence[Any],
            questions: Mapping[str, Any]) -> dict[str, Any]:
    """Both models' milliseconds per decision: the teacher's as each of its answers took them
    (recorded as they were collected: no state is asked again to time it), the student's on the
    held-out states, one at a time."""
    teacher_ms = [float(o["ms"]) for o in outcomes.values() if "response" in o and "ms" in o]
    student_ms = []
    for state in states[:MAX_TIMED]:
        started = time.perf_counter()
        student.predict(state, questions)
        student_ms.append((time.perf_counter() - started) * 1000.0)
    n_questions = max(1, len(questions))
    t50 = float(np.median(teacher_ms)) if teacher_ms else math.nan
    s50 = float(np.median(student_ms)) if student_ms else math.nan
    return {"teacher_answers_timed": len(teacher_ms), "student_states_timed": len(student_ms),
            "teacher_ms_per_state_p50": t50, "student_ms_per_state_p50": s50,
            "teacher_ms_per_decision": t50 / n_questions, "student_ms_per_decision": s50 / n_questions,
            "speedup": t50 / s50 if s50 > 0 else math.nan}


def distill(teacher: str | os.PathLike, student: str | os.PathLike, states_path: str | os.PathLike,
            questions: Mapping[str, Any], out: str | os.PathLike, *, api_key: str | None = None,
            concurrency: int = 4, rate: float | None = None, hard_weight: float = 0.5, threads: int | None = None,
            progress: bool = True, teacher_model: str | None = None, student_layers: int | None = None,
            min_agreement: float | None = None, **settings: Any) -> dict[str, Any]:
    """The whole run; returns the report (also in `OUT/report/distill.json`). `settings` are
    `laya train`'s (`laya.training.loop.Settings`).

    `student_layers`: the student is `student` cut to that many encoder layers (`laya.training.shrink`)
    before it is trained; `student` may be the teacher's own checkpoint. `min_agreement`: the student is
    trained aside and written to `out` only if every question's held-out top-1 agreement with the teacher
    reaches it; otherwise a `LayaError` names the questions that fell short and `out` holds only the
    teacher's answers and the report."""
    import laya
    from laya.apps.evaluation import parse_method
    from laya.calibration.data import read_records
    from laya.training.loop import Settings

    _check_bounds(hard_weight, min_agreement, student_layers)
    teacher = os.fspath(teacher)
    teacher_model = teacher_model or parse_method(teacher).model
    out = Path(out)
    states = read_states(states_path, questions)
    outcomes, cost = collect(states, questions, teacher, out, api_key=api_key, concurrency=concurrency, rate=rate,
                             threads=threads, progress=progress, model=teacher_model)
    lines, refused = targets(states, questions, outcomes, hard_weight)
    if not lines:
        raise LayaError(f"the teacher answered none of the {len(states)} states; nothing to distill "
                        f"(first refusal: {refused[0]['error'] if refused else 'none'})")
    data = write_data(lines, out / TEACHER_DIR / DATA)
    candidate, start = out / CANDIDATE, student
    shutil.rmtree(candidate, ignore_errors=True)
    if student_layers is not None:
        from laya.training.shrink import shrink

        start = shrink(student, student_layers, out / STUDENT_INIT)
    try:
        train_report = laya.train(start, data, candidate, quiet=not progress, threads=threads, **settings)
    finally:
        if student_layers is not None:
            shutil.rmtree(out / STUDENT_INIT, ignore_errors=True)
    setting = Settings(**{k: v for k, v in settings.items()})
    trained = laya.load(candidate, runtime="torch")
    held = held_out(read_records(data), setting.holdout, setting.seed)
    heldout = compare(trained, held)
    report = {
        "teacher": teacher, "student": os.fspath(student),
        "student_layers": trained.checkpoint.encoder.num_hidden_layers,
        "kept_layers": json.loads((candidate / CONFIG_FILE).read_text(encoding="utf-8")).get("student", {}).get(
            "kept_layers"),
        "states": len(states), "distinct_states": len({key_of(s.state, questions) for s in states}),
        "answered": len(lines), "refused": len(refused), "refusals": refused[:20], "teacher_cost": cost.totals,
        "hard_weight": hard_weight, "min_agreement": min_agreement, "heldout": heldout,
        "heldout_lines": [r.line for r in held],
        "timing": timings(outcomes, trained, [r.state for r in held] or [s.state for s in states], questions),
        "training": {k: train_report[k] for k in ("split", "training", "heldout", "act_head") if k in train_report},
        "checkpoint": os.fspath(out),
    }
    report["short_of_min_agreement"] = short = short_of(heldout, min_agreement)
    if short:
        shutil.rmtree(candidate, ignore_errors=True)
        report["checkpoint"] = None
        _write_report(out, report)
        raise LayaError(f"the student was not written: its held-out top-1 agreement with the teacher is below "
                        f"--min-agreement {min_agreement:g} on " + ", ".join(
                            f"{qid!r} ({a:.1%})" for qid, a in short.items())
                        + f" (report in {out / 'report' / REPORT})")
    _promote(candidate, out)
    _write_report(out, report)
    return report


def _check_bounds(hard_weight: float, min_agreement: float | None, student_layers: int | None) -> None:
    if not 0.0 <= hard_weight <= 1.0:
        raise LayaError(f"--hard-weight must be from 0 to 1, got {hard_weight}")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise LayaError(f"--min-agreement must be from 0 to 1, got {min_agreement}")
    if student_layers is not None and (isinstance(student_layers, bool) or not isinstance(student_layers, int)
                                       or student_layers < 1):
        raise LayaError(f"--student-layers must be a whole number of layers, 1 or more, got {student_layers!r}")


def _promote(candidate: Path, out: Path) -> None:
    """The trained student's files, from where it was trained aside, into `out` (reports merged)."""
    for entry in candidate.iterdir():
        target = out / entry.name
        if entry.is_dir() and entry.name == "report":
            target.mkdir(exist_ok=True)
            for item in entry.iterdir():
                _replace(item, target / item.name)
            continue
        _replace(entry, target)
    shutil.rmtree(candidate)


def _replace(source: Path, target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(source, target)


def _write_report(out: Path, report: Mapping[str, Any]) -> None:
    (out / "report").mkdir(parents=True, exist_ok=True)
    (out / "report" / REPORT).write_text(json.dumps(report, indent=2, default=_plain) + "\n", encoding="utf-8")


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(type(value).__name__)


def summary(report: Mapping[str, Any]) -> str:
    h, t = report["heldout"], report["timing"]
    auroc_text = "-" if h["act_auroc"] is None else f"{h['act_auroc']:.3f}"
    cut = (f"a {report['student_layers']}-layer student (the teacher's layers {report['kept_layers']}): "
           if report.get("kept_layers") else "")
    return (cut + f"distilled {report['answered']} of {report['states']} states ({report['refused']} refused by the "
            f"teacher); on {h['answers']} held-out answers the student agrees with the teacher "
            f"{h['agreement']:.1%} (KL {h['kl']:.3f}, ECE {h['ece_vs_teacher']:.3f}, act head AUROC {auroc_text}); "
            f"{t['student_ms_per_decision']:.1f} ms per decision against the teacher's "
            f"{t['teacher_ms_per_decision']:.1f} ms ({t['speedup']:.1f}x)"
            + (f"; the teacher cost {', '.join(f'{k} {v:g}' for k, v in report['teacher_cost'].items())}"
               if report["teacher_cost"] else ""))
