"""A chat model answering System One questions through the decide policy."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from laya.calibration.evidence import Evidence
from laya.calibration.file import Calibration
from laya.calibration.temperatures import Temperatures, clamp
from laya.config import QTYPES
from laya.decide.backend import DecideBackend
from laya.decide.policy import Decider, DecideRefused, PrefixCache, Prompt, label_tokens, split_prompt
from laya.decide.prompts import (
    READOUTS,
    LabelStyle,
    Readout,
    check_fits,
    choice_by_letters,
    choice_by_names,
    noul_both_orders,
    prefix_for,
    score_by_digits,
)
from laya.errors import Cancelled, QuestionError
from laya.heads import decode
from laya.limits import UNLIMITED, Limits
from laya.questions import Question, check_state, parse_questions
from laya.response import SystemOneResponse


@dataclass(frozen=True)
class Planned:
    """One question over one state as `prepare` left it: its readouts tokenised and checked, so that
    answering tokenises nothing again. `keys[i]` maps readout i's labels to the question's answers."""

    question: Question
    keys: tuple[tuple[int, ...], ...]
    prompts: tuple[Prompt, ...]


@dataclass
class DecideSettings:
    """Per-model settings: temperature per question type (fitted by `laya calibrate`) and readout."""

    temperature: dict[str, float] = field(default_factory=lambda: {"choice": 1.0, "score": 1.0, "noul": 1.0})
    readout: str = "auto"  # auto | names | letters (see laya.decide.prompts)
    # collision tree: forward passes per decision for expanding groups that cannot hold the best answer
    # (a group that can is always expanded); past it a group's mass is split equally, as pcdServer does
    tree_budget: int = 8

    def __post_init__(self):
        if self.readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {self.readout!r}")


class DecideModel:
    """`predict(state, questions)` with the same response shape as the encoder models."""

    def __init__(self, backend: DecideBackend, name: str, *, cache: PrefixCache | None = None,
                 settings: DecideSettings | None = None, source: str = "", calibration: Calibration | None = None):
        self.backend = backend
        self.name = name
        self.source = source
        self.decider = Decider(backend, cache)
        self.settings = settings or DecideSettings()
        temps = self.settings.temperature
        self.temperatures = Temperatures(per_type=tuple(clamp(temps.get(q, 1.0)) for q in QTYPES))  # type: ignore[arg-type]
        self.calibration = calibration
        self.abstention = calibration.abstention if calibration else None
        if calibration is not None:
            calibration.check_model(self.fingerprint, source or name)
            self.temperatures = calibration.over(self.temperatures)
        self._lock = threading.Lock()  # one live context: decisions run one at a time
        space = backend.tokenize(" A")
        self.style = LabelStyle(templated=backend.templated, space_labels=len(space) == 1)

    def _names_usable(self, labels: list[str]) -> bool:
        if self.settings.readout == "letters":
            return False
        try:
            label_tokens(self.backend, [self.style.label(x) for x in labels])
            return True
        except DecideRefused:
            return False

    def readouts(self, q: Question) -> list[Readout]:
        """The prompts that answer `q` (all checked here, before any prefill)."""
        if q.qtype == "score":
            return [score_by_digits(q, self.style)]
        if q.qtype == "noul":
            return noul_both_orders(q, self.style, names=self._names_usable(["yes", "no"]))
        names = self._names_usable(list(q.names))
        if not names and self.settings.readout == "names":
            raise QuestionError(f"question {q.qid!r}: its option names share first tokens; "
                                "use distinct first words or the letters readout", qid=q.qid)
        check_fits(q, names_usable=names)
        return [choice_by_names(q, self.style) if names else choice_by_letters(q, self.style)]

    def prepare(self, states: list[Any], questions: Mapping[str, Any], *, limits: Limits = UNLIMITED
                ) -> tuple[list[Any], list[Question], list[list[Planned]]]:
        """Validate everything a decision would refuse, before anything is queued or prefilled: the
        decisions are counted before any prompt is tokenised, the tokens as the prompts are built.
        What it tokenised is kept (per state, per question) for answering."""
        parsed = parse_questions(questions)
        reads = {q.qid: self.readouts(q) for q in parsed}
        limits.check("decisions", len(states) * sum(len(r) for r in reads.values()))
        tokens, plans = 0, []
        for state in states:
            planned, tokens = self._plan(state, parsed, reads, limits, tokens)
            plans.append(planned)
        return list(states), parsed, plans

    def _plan(self, state: Any, parsed: list[Question], reads: dict[str, list[Readout]], limits: Limits,
              tokens: int) -> tuple[list[Planned], int]:
        """One state's questions tokenised and checked; `tokens` is the count so far (against the limit)."""
        check_state(state)
        prefix = prefix_for(state)
        alone = self.backend.prompt_tokens(prefix)
        planned = []
        for q in parsed:
            split = [split_prompt(self.backend, prefix, r.suffix, alone) for r in reads[q.qid]]
            lengths = [len(full) for full, _ in split]
            tokens += sum(lengths)
            limits.check("tokens", tokens)
            longest = max(lengths)
            if longest > self.backend.n_ctx:
                raise QuestionError(f"question {q.qid!r}: the prompt takes {longest} tokens; the model's "
                                    f"context holds {self.backend.n_ctx}", qid=q.qid, error_type="max_tokens_exceeded")
            if any(len(full) == n_prefix for full, n_prefix in split):
                raise QuestionError(f"question {q.qid!r}: the prompt has no question after its prefix", qid=q.qid)
            prompts = tuple(Prompt(full, n_prefix, label_tokens(self.backend, list(r.labels)))
                            for (full, n_prefix), r in zip(split, reads[q.qid]))
            planned.append(Planned(q, tuple(tuple(r.keys) for r in reads[q.qid]), prompts))
        return planned, tokens

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the GGUF file: what a calibration file names."""
        from laya.encoder.checkpoint import sha256_of

        return sha256_of(Path(self.source)) if self.source and Path(self.source).is_file() else ""

    def evidence_one(self, state: Any, parsed: list[Question], *, reuse_prefix: bool = True,
                     cancelled: threading.Event | None = None, planned: list[Planned] | None = None
                     ) -> tuple[list[Evidence], list[dict[str, Any]], int]:
        """Per question: the first-token log-probabilities of each readout (untempered), the question's
        extras (outside mass, prefill reports), and the prompt tokens read in all. `planned` is what
        `prepare` tokenised for this state (planned here when not given). `cancelled` (the caller went
        away) stops before the next decision."""
        if planned is None:
            planned, _ = self._plan(state, parsed, {q.qid: self.readouts(q) for q in parsed}, UNLIMITED, 0)
        evidence, extras, tokens = [], [], 0
        with self._lock:
            for plan in planned:
                q = plan.question
                readouts, outside, reports = [], 0.0, []
                for keys, prompt in zip(plan.keys, plan.prompts):
                    if cancelled is not None and cancelled.is_set():
                        raise Cancelled("the caller went away")
                    scores, report = self.decider.run(prompt, reuse_prefix=reuse_prefix,
                                                      tree_budget=self.settings.tree_budget)
                    readouts.append((keys, scores.logp))
                    outside += scores.outside_mass
                    reports.append(report)
                    tokens += report.n_tokens
                evidence.append(Evidence(q.qtype, q.n_options, tuple(readouts)))
                extras.append({"x_outside_mass": outside / len(plan.prompts),
                               "x_levels": max(r.levels for r in reports),
                               "x_prefill": [r.as_extras() for r in reports]})
        return evidence, extras, tokens

    def answer_one(self, state: Any, parsed: list[Question], *, reuse_prefix: bool = True,
                   cancelled: threading.Event | None = None, planned: list[Planned] | None = None) -> SystemOneResponse:
        evidence, extras, tokens = self.evidence_one(state, parsed, reuse_prefix=reuse_prefix, cancelled=cancelled,
                                                     planned=planned)
        answers = {}
        for q, ev, extra in zip(parsed, evidence, extras):
            p = ev.probabilities(self.temperatures.for_question(q.qtype, q.n_options))
            if self.abstention is not None:
                extra |= self.abstention.extras(q.qtype, q.n_options, p)
            answers[q.qid] = decode.answer(q, p, extra)
        return SystemOneResponse(model=self.name, answers=answers, input_tokens=int(tokens))

    def predict(self, state: Any, questions: Mapping[str, Any], *, reuse_prefix: bool = True) -> dict[str, Any]:
        states, parsed, plans = self.prepare([state], questions)
        return self.answer_one(states[0], parsed, reuse_prefix=reuse_prefix, planned=plans[0]).to_json()
