"""A chat model answering System One questions through the decide policy."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from laya.calibration.evidence import Evidence
from laya.calibration.file import Calibration
from laya.calibration.temperatures import Temperatures, clamp
from laya.decide.backend import DecideBackend
from laya.decide.policy import Decider, PrefixCache, Prompt
from laya.decide.profiles import LABELS, PROFILES, TOP_TOKENS, Scored, make_profile
from laya.decide.prompts import Readout
from laya.decoding import decode
from laya.errors import Cancelled, QuestionError
from laya.limits import UNLIMITED, Limits
from laya.questions import QTYPES, Question, check_state
from laya.request import Request
from laya.response import SystemOneResponse
from laya.stop import StopFlag
from laya.tournament import Tournament, narrowed, tournament_rows

GROUP_MARGIN = 16  # tokens a tournament group's prompt leaves free (merges differ between groups)
TREE_LEVELS = 33  # answer tokens the collision tree may feed after a prompt (its max_levels of 32, and one)


@dataclass(frozen=True)
class Planned:
    """One question over one state as `prepare` left it: its readouts tokenised and checked, so that
    answering tokenises nothing again. `keys[i]` maps readout i's labels to the question's answers."""

    question: Question
    keys: tuple[tuple[int, ...], ...]
    prompts: tuple[Prompt, ...]
    isolated: bool = False  # one no/yes prompt per level (laya.calibration.evidence.Evidence.isolated)
    group: int = 0  # a choice played as a tournament of groups of this size (its prompts are built per round)


def tree_room(scored: Scored) -> int:
    """Tokens a decision may read after its prompt: the collision tree feeds a label's tokens one level at
    a time where labels share beginnings (at most `TREE_LEVELS`); a letters readout reads the top tokens."""
    if scored.letters is not None:
        return 0
    return min(TREE_LEVELS, max((len(label) for label in scored.labels), default=1) - 1)


def _longest(split: list[tuple[list[int], int]], scored: list[Scored]) -> int:
    """The most context one of a question's decisions takes: its prompt and the answer tokens after it
    (a prompt that fits while its answers do not failed inside llama.cpp, a 500, before)."""
    return max(len(full) + tree_room(s) for (full, _), s in zip(split, scored))


def decisions(plan: Planned) -> int:
    """The decisions a question over one state takes: its prompts, or every group of its tournament."""
    return tournament_rows(plan.question.n_options, plan.group) if plan.group else len(plan.prompts)


@dataclass
class DecideSettings:
    """Per-model settings: the readout profile (laya.decide.profiles) and where it was chosen, the
    temperature per question type (the model's own, from its metadata, or fitted by `laya calibrate`)."""

    temperature: dict[str, float] = field(default_factory=lambda: {"choice": 1.0, "score": 1.0, "noul": 1.0})
    readout: str = "first-token"
    readout_from: str = "default"  # default | --readout | metadata JSON | GGUF metadata
    temperature_from_model: bool = False  # the temperature is the model's own (answer-slot's metadata)
    labels: str = "auto"  # first-token: auto | names | letters (see laya.decide.prompts)
    # collision tree: forward passes per decision for expanding groups that cannot hold the best answer
    # (a group that can is always expanded); past it a group's mass is split equally, as pcdServer does
    tree_budget: int = 8
    top_tokens: int = TOP_TOKENS  # letters: the top tokens a letter is read from

    def __post_init__(self):
        if self.readout not in PROFILES:
            raise ValueError(f"readout must be one of {', '.join(PROFILES)}, got {self.readout!r}")
        if self.labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {self.labels!r}")


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
        self.profile = make_profile(self.settings.readout, backend, self.settings.labels)
        self.probe: Any = None  # laya.decide.lens.Probe under --decide-probe

    @property
    def readout(self) -> dict[str, Any]:
        """What `/v1/models`, `/health` and each answer (`x_readout`) say about how it is read: a
        readout is calibrated by the model's own temperature (answer-slot's metadata) or a fitted file."""
        calibrated = self.calibration is not None or (self.profile.calibrated and self.settings.temperature_from_model)
        return {"name": self.profile.name, "calibrated": calibrated, "from": self.settings.readout_from}

    def readouts(self, q: Question) -> list[Readout]:
        """The prompts that answer `q` (all checked here, before any prefill)."""
        return self.profile.asks(q)

    def prepare_request(self, request: Request, *, limits: Limits = UNLIMITED) -> tuple[list[Any], list[list[Planned]]]:
        """Everything a decision would refuse, before anything is queued or prefilled: the decisions are
        counted before any prompt is tokenised (again with the tournaments, once planned), the tokens as
        the prompts are built. What it tokenised is kept (per state, per question) for answering.
        `tournament=G` plays every choice of more than G options in groups of G."""
        parsed, tournament = list(request.questions), request.options.tournament
        reads = {q.qid: self.readouts(q) for q in parsed}
        limits.check("decisions", len(request.states) * sum(len(r) for r in reads.values()))
        groups = {q.qid: tournament for q in parsed if tournament and q.qtype == "choice" and q.n_options > tournament}
        tokens, plans = 0, []
        for state in request.states:
            planned, tokens = self._plan(state, parsed, reads, limits, tokens, groups)
            plans.append(planned)
        limits.check("decisions", sum(decisions(p) for planned in plans for p in planned))
        return list(request.states), plans

    def _plan(self, state: Any, parsed: list[Question], reads: dict[str, list[Readout]], limits: Limits,
              tokens: int, tournaments: dict[str, int] | None = None) -> tuple[list[Planned], int]:
        """One state's questions tokenised and checked; `tokens` is the count so far (against the limit).
        A choice whose prompt the context cannot hold is played as a tournament of groups that it can
        (`tournaments` names the group size a request asked for). Where the prefix names the questions
        (json-field's system turn), it names those answered in one prompt only: each group of a
        tournament is asked under its own."""
        profile, n_ctx = self.profile, self.backend.n_ctx
        groups = {qid: g for qid, g in (tournaments or {}).items()}
        alone: list[Any]
        prefix, alone, n_schema, splits = None, [], 0, {}
        for _ in range(2):  # a second pass when a tournament leaves a prefix that names the questions
            rest = [q for q in parsed if q.qid not in groups]
            prefix = profile.prefix(state, rest)
            alone, n_schema = profile.prefix_tokens(prefix)
            splits = {q.qid: [profile.prompt(prefix, alone, r) for r in reads[q.qid]] for q in rest}
            scores = {q.qid: [profile.scored(r) for r in reads[q.qid]] for q in rest}
            too_long = {q.qid: q for q in rest if q.qtype == "choice"
                        and _longest(splits[q.qid], scores[q.qid]) > n_ctx}
            for q in too_long.values():
                if group := self._group_size(state, q):
                    groups[q.qid] = group
            if not profile.names_questions or not set(too_long) & set(groups):
                break
        planned = []
        for q in parsed:
            if q.qid in groups:
                tokens += min(len(self.profile.prompt(prefix, alone, r)[0]) for r in reads[q.qid])  # about round 1
                limits.check("tokens", tokens)
                planned.append(Planned(q, (), (), group=groups[q.qid]))
                continue
            split, scored = splits[q.qid], scores[q.qid]
            tokens += sum(len(full) for full, _ in split)
            limits.check("tokens", tokens)
            longest = _longest(split, scored)
            if longest > n_ctx:
                raise QuestionError(f"question {q.qid!r}: the prompt takes {longest} tokens with the answer tokens "
                                    f"read after it; the model's context holds {n_ctx}", qid=q.qid,
                                    error_type="max_tokens_exceeded")
            if any(len(full) == n_prefix for full, n_prefix in split):
                raise QuestionError(f"question {q.qid!r}: the prompt has no question after its prefix", qid=q.qid)
            prompts = tuple(Prompt(full, n_prefix, s.labels, s.letters, n_schema)
                            for (full, n_prefix), s in zip(split, scored))
            planned.append(Planned(q, tuple(tuple(r.keys) for r in reads[q.qid]), prompts, profile.isolated(q)))
        return planned, tokens

    def _group_size(self, state: Any, q: Question) -> int:
        """The largest group of `q`'s options whose prompt the context holds even for its longest
        options (so every group of every round fits), with `GROUP_MARGIN` tokens to spare; 0 (the
        prompt is refused as too long) when not even two fit."""
        budget = self.backend.n_ctx - GROUP_MARGIN
        order = sorted(range(q.n_options), key=lambda i: len(self.backend.tokenize(q.options[i])), reverse=True)

        def fits(size: int) -> bool:
            worst = narrowed(q, sorted(order[:size]))
            prefix = self.profile.prefix(state, [worst])
            alone, _ = self.profile.prefix_tokens(prefix)
            return all(len(self.profile.prompt(prefix, alone, r)[0]) + tree_room(self.profile.scored(r)) <= budget
                       for r in self.profile.asks(worst))

        if not fits(2):
            return 0
        low, high = 2, q.n_options - 1  # low fits; high + 1 does not
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits(mid) else (low, mid - 1)
        return low

    def _played(self, state: Any, plan: Planned, reuse_prefix: bool, cancelled: StopFlag | threading.Event | None
                ) -> tuple[Evidence, dict[str, Any], int]:
        """A choice answered by a tournament of groups (laya.tournament's rounds and shares):
        each group a question of its own over the same state (its prefix kept across the groups), its
        top answer through to the next round, then one final group. The shares come out tempered, so
        the evidence is their logarithm (decoded at temperature 1)."""
        q, game, reports, tokens = plan.question, Tournament(plan.question, plan.group), [], 0
        temperature = self.temperatures.for_question

        def probabilities(group_q: Question) -> np.ndarray:
            nonlocal tokens
            if group_q.n_options == 1:  # a group of one (near-equal groups of two can leave one) goes through
                return np.ones(1)
            (inner,), _ = self._plan(state, [group_q], {group_q.qid: self.readouts(group_q)}, UNLIMITED, 0)
            if not inner.prompts:
                raise QuestionError(f"question {q.qid!r}: a group of its tournament does not fit the context",
                                    qid=q.qid, error_type="max_tokens_exceeded")
            readouts = []
            for keys, prompt in zip(inner.keys, inner.prompts):
                if cancelled is not None and cancelled.is_set():
                    raise Cancelled("the caller went away")
                scores, report = self._decide(group_q, keys, prompt, reuse_prefix)
                readouts.append((keys, scores.logp))
                reports.append(report)
                tokens += report.n_tokens
            evidence = Evidence("choice", group_q.n_options, tuple(readouts))
            return evidence.probabilities(temperature("choice", group_q.n_options))

        while not game.done:
            game.record([probabilities(g) for g in game.next_round()])
        final = probabilities(game.finalists())
        shares = game.shares(final)
        logits = np.log(np.maximum(shares, 1e-300))
        extra = {"x_tournament": game.report(final), "x_levels": max((r.levels for r in reports), default=1),
                 "x_prefill": [r.as_extras() for r in reports]}
        return Evidence.single("choice", logits), extra, tokens

    def _decide(self, q: Question, keys: tuple[int, ...], prompt: Prompt, reuse_prefix: bool) -> tuple[Any, Any]:
        """One decision, and its lens line when probing (`--decide-probe`)."""
        scores, report = self.decider.run(prompt, reuse_prefix=reuse_prefix, tree_budget=self.settings.tree_budget,
                                          top=self.settings.top_tokens)
        if self.probe is not None:
            labels = [q.keys[k] for k in keys] if len(keys) == len(scores.logp) else ["no", "yes"]
            self.probe.record(q.qid, prompt, labels, scores.logp, report)
        return scores, report

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the GGUF file, and the readout unless it is first-token: what a calibration file
        names (a temperature fitted on one readout means nothing on another)."""
        from laya.digests import sha256_of

        if not (self.source and Path(self.source).is_file()):
            return ""
        readout = self.settings.readout
        return sha256_of(Path(self.source)) + ("" if readout == "first-token" else f":{readout}")

    def evidence_one(self, state: Any, parsed: list[Question], *, reuse_prefix: bool = True,
                     cancelled: StopFlag | threading.Event | None = None, planned: list[Planned] | None = None
                     ) -> tuple[list[Evidence], list[dict[str, Any]], int]:
        """Per question: the first-token log-probabilities of each readout (untempered), the question's
        extras (outside mass, prefill reports), and the prompt tokens read in all. `planned` is what
        `prepare` tokenised for this state (planned here when not given). `cancelled` (the caller went
        away) stops before the next decision."""
        if planned is None:  # not through a Request: the state is checked here
            check_state(state)
            planned, _ = self._plan(state, parsed, {q.qid: self.readouts(q) for q in parsed}, UNLIMITED, 0)
        evidence, extras, tokens = [], [], 0
        readout = self.readout
        with self._lock:
            for plan in planned:
                q = plan.question
                if plan.group:
                    ev, extra, used = self._played(state, plan, reuse_prefix, cancelled)
                    evidence.append(ev)
                    extras.append({"x_readout": readout, **extra})
                    tokens += used
                    continue
                readouts, outside, reports = [], 0.0, []
                for keys, prompt in zip(plan.keys, plan.prompts):
                    if cancelled is not None and cancelled.is_set():
                        raise Cancelled("the caller went away")
                    scores, report = self._decide(q, keys, prompt, reuse_prefix)
                    readouts.append((keys, scores.logp))
                    outside += scores.outside_mass
                    reports.append(report)
                    tokens += report.n_tokens
                evidence.append(Evidence(q.qtype, q.n_options, tuple(readouts), isolated=plan.isolated))
                extras.append({"x_readout": readout, "x_outside_mass": outside / len(plan.prompts),
                               "x_levels": max(r.levels for r in reports),
                               "x_prefill": [r.as_extras() for r in reports]})
        return evidence, extras, tokens

    def answer_one(self, state: Any, parsed: list[Question], *, reuse_prefix: bool = True,
                   cancelled: StopFlag | threading.Event | None = None,
                   planned: list[Planned] | None = None) -> SystemOneResponse:
        evidence, extras, tokens = self.evidence_one(state, parsed, reuse_prefix=reuse_prefix, cancelled=cancelled,
                                                     planned=planned)
        answers = {}
        for q, ev, extra in zip(parsed, evidence, extras):
            tempered = "x_tournament" in extra  # its rounds applied the temperature
            p = ev.probabilities(1.0 if tempered else self.temperatures.for_question(q.qtype, q.n_options))
            if self.calibration is not None:  # prediction set, abstention
                extra |= self.calibration.extras(q.keys, q.qtype, p, None)
            answers[q.qid] = decode.answer(q, p, extra)
        return SystemOneResponse(model=self.name, answers=answers, input_tokens=int(tokens))

    def predict(self, state: Any, questions: Mapping[str, Any], *, reuse_prefix: bool = True) -> dict[str, Any]:
        request = Request.of([state], questions)
        states, plans = self.prepare_request(request)
        return self.answer_one(states[0], list(request.questions), reuse_prefix=reuse_prefix,
                               planned=plans[0]).to_json()
