"""A loaded laya model: checkpoint + runtime + policy, answering System One requests.

The straight line of one request: questions are validated once, the state is tokenised once,
each question's head is built once, rows go through the runtime in padded batches, and each row
of logits is decoded with its bucket's temperature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from laya.calibration.evidence import Evidence
from laya.calibration.file import Calibration
from laya.calibration.temperatures import Temperatures, bucket_key
from laya.calibration.upstream import apply_binning
from laya.decoding import decode
from laya.encoder.batch import collate, padded_length
from laya.encoder.checkpoint import Checkpoint
from laya.encoder.head_layout import NO_ACT_HEAD
from laya.encoder.rows import HeadCache, QuestionTokens, Row, StateTokens, build_row, compact_row, tokenize_state
from laya.encoder.runtimes.base import Runtime
from laya.encoder.shortlist import shortlist_request, widened
from laya.encoder.windows import Windows, aggregate, cut, plan
from laya.errors import QuestionError
from laya.limits import UNLIMITED, Limits
from laya.orders import execute_in_orders, prepare_in_orders
from laya.questions import Question, check_state
from laya.request import AS_GIVEN, Overflow, Request, Scan, check_strict
from laya.response import SystemOneResponse
from laya.stop import StopFlag
from laya.structured import (
    apply_gate,
    check_min_confidence,
    details,
    plan_schema,
    questions_of,
    settle,
)
from laya.structured.gate import Threshold
from laya.tournament import DEFAULT_GROUP, Tournament, tournament_rows

if TYPE_CHECKING:  # auto's machinery sits above the model: it builds models, the model only holds its records
    from laya.encoder.choice import Choice
    from laya.encoder.upgrade import Upgrade

DEFAULT_MAX_BATCH_ROWS = 32


def row_usage(questions: list[Question], rows_of: Mapping[str, list[Row]]) -> tuple[int, dict[str, Any]]:
    """`input_tokens` and `x_usage` of one state from the rows each question took (in question order):
    what an answer reports and what a plan foretells."""
    every_row = [r for q in questions for r in rows_of[q.qid]]
    usage: dict[str, Any] = {
        "state_tokens": every_row[0].state_tokens,
        "state_tokens_kept": min(r.state_tokens_kept for r in every_row),
        "state_tokens_dropped": max(r.state_tokens_dropped for r in every_row),
        "truncated_questions": [q.qid for q in questions if any(r.state_tokens_dropped for r in rows_of[q.qid])],
        "rows": len(every_row),
    }
    if any(r.compacted for r in every_row):
        usage["compacted"] = {q.qid: dict(rows_of[q.qid][0].compacted) for q in questions
                              if rows_of[q.qid][0].compacted}
    return int(sum(len(r.ids) for r in every_row)), usage


def _read_whole(job: Prepared, responses: list[SystemOneResponse]) -> list[SystemOneResponse]:
    """A scanned job's responses, one per state of the request (its windows' answers made one)."""
    if job.windows is None or not responses:  # not scanned, or cancelled (no answers)
        return responses
    out, at = [], 0
    for read in job.windows:
        out.append(aggregate(read, responses[at : at + read.count]))
        at += read.count
    return out


@dataclass
class Prepared:
    """A request after validation and row building, before any runtime call.

    `cancelled` is set when the caller went away or its deadline passed: its rows not yet run are skipped."""

    questions: list[Question]
    rows: list[list[Row]]  # per state, one row per question answered in one row (not the tournaments)
    cancelled: StopFlag = field(default_factory=StopFlag)
    tournaments: dict[str, int] = field(default_factory=dict)  # qid -> group size, for choices too large
    states: list[StateTokens] = field(default_factory=list)
    max_len: int = 0
    # a scanned request: per state of the request, how it was read; `states` and `rows` then hold
    # every window of every state in order, and the answers of a state's windows make its one answer
    windows: list[Windows] | None = None
    # `x_shortlist` choices: qid -> (what the answer reports, the options as asked) (laya.encoder.shortlist)
    shortlists: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = field(default_factory=dict)

    @property
    def tournament_rows(self) -> int:
        """Rows the tournaments take per state: every group of every round, and the final row."""
        return sum(tournament_rows(q.n_options, self.tournaments[q.qid]) for q in self.questions
                   if self.tournaments.get(q.qid))

    @property
    def n_rows(self) -> int:
        return sum(len(rows) for rows in self.rows) + len(self.states) * self.tournament_rows

    @property
    def n_tokens(self) -> int:
        """Tokens of the one-row questions as built, and at most `max_len` per tournament row."""
        return (sum(len(row.ids) for rows in self.rows for row in rows)
                + len(self.states) * self.tournament_rows * self.max_len)


@dataclass
class Played:
    """A tournament played over one state: the game, its final row's logits and act, every row taken."""

    tournament: Tournament
    logits: np.ndarray
    act: np.ndarray
    rows: list[Row]


class Model:
    """`laya.load(...)` returns one of these; `predict` answers one state, `predict_batch` many."""

    def __init__(
        self, checkpoint: Checkpoint, runtime: Runtime, *, name: str | None = None,
        temperatures: Temperatures | None = None, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        calibration: Calibration | None = None, choice: Choice | None = None,
    ):
        self.checkpoint = checkpoint
        self.runtime = runtime
        self.choice = choice  # how runtime="auto" chose the runtime, when it did
        self.upgrade: Upgrade | None = None  # auto's pick being prepared in the background, when it is
        self.name = name or checkpoint.path.name
        cfg = checkpoint.config
        self.temperatures = temperatures or Temperatures.from_raw(
            cfg.temperature, cfg.temperature_by_options, source=str(checkpoint.path / "rl_agent_config.json")
        )
        self.max_batch_rows = max_batch_rows
        self.head_of = HeadCache(checkpoint.tokenizer, cfg.head_max_len)
        self.calibration = calibration
        self.abstention = calibration.abstention if calibration else None
        self.binning = calibration.binning if calibration else None  # an upstream file's binning map
        if calibration is not None:
            calibration.check_model(checkpoint.fingerprint, str(checkpoint.path))
            self.temperatures = calibration.over(self.temperatures)

    @property
    def tokenizer(self):
        return self.checkpoint.tokenizer

    @property
    def max_len(self) -> int:
        return self.checkpoint.config.max_len

    @property
    def head_max_len(self) -> int:
        return self.checkpoint.config.head_max_len

    def prepare(self, states: Sequence[Any], questions: Mapping[str, Any], tournament: int | None = None,
                overflow: Overflow = None, limits: Limits = UNLIMITED) -> Prepared:
        """Validate (`Request.of`, as the API validates) and build every row; raises `QuestionError` before
        any inference. The options are `prepare_request`'s."""
        return self.prepare_request(Request.of(list(states), questions, tournament=tournament, overflow=overflow),
                                    limits)

    def prepare_request(self, request: Request, limits: Limits = UNLIMITED) -> Prepared:
        """Every row of a validated request; raises `QuestionError` before any inference.

        A choice whose option markers do not all fit in the model's row is answered by a tournament
        (groups of 16, as upstream's `predict_tournament`); `tournament=G` asks for one on every choice
        of more than G options. Every other question is answered in one row, exactly as upstream.

        `overflow` is what happens to a state longer than the row: None or "truncate" keeps its start
        (a conversation's end), "keep_start" / "keep_end" say which, a `Scan` reads it in windows
        (`laya.encoder.windows`); its windows count against `limits` before any is decoded."""
        parsed, tournament, overflow = list(request.questions), request.options.tournament, request.options.overflow
        tok = self.tokenizer
        heads: dict[str, QuestionTokens] = {q.qid: self.head_of(q) for q in parsed}
        groups: dict[str, int] = {}
        for q in parsed:
            if q.qtype != "choice":
                continue
            if tournament is not None and q.n_options > tournament:
                groups[q.qid] = tournament
            elif q.n_options > DEFAULT_GROUP and any(m >= self.max_len for m in heads[q.qid].markers):
                groups[q.qid] = DEFAULT_GROUP
        plain = [q for q in parsed if q.qid not in groups]
        tokens = [tokenize_state(tok, s) for s in request.states]
        windows = None
        if overflow in ("keep_start", "keep_end"):
            tokens = [StateTokens(st.ids, keep_end=overflow == "keep_end") for st in tokens]
        elif isinstance(overflow, Scan):
            tokens, windows = self._windows(tokens, [heads[q.qid] for q in parsed], overflow, limits)
        rows = [[self._compacted(q, st, build_row(tok, q, heads[q.qid], st, self.max_len)) for q in plain]
                for st in tokens]
        return Prepared(questions=parsed, rows=rows, tournaments=groups, states=tokens, max_len=self.max_len,
                        windows=windows)

    def _windows(self, tokens: list[StateTokens], heads: list[QuestionTokens], scan: Scan, limits: Limits
                 ) -> tuple[list[StateTokens], list[Windows]]:
        """Every state's windows, as states of their own (a state read in one pass stays as it is)."""
        rooms = [max(0, self.max_len - len(h.ids) - 1) for h in heads]
        size, step, room = plan(rooms, self.max_len, self.head_max_len, scan)
        explicit = scan.window is not None and scan.window > 0
        plans = [cut(len(st.ids), size, step, room, explicit) for st in tokens]
        limits.check("rows", sum(read.count for read in plans) * len(heads))
        out = []
        for st, read in zip(tokens, plans):
            if not read.starts:
                out.append(st)
                continue
            texts = [self.tokenizer.decode(st.ids[i : i + size]) for i in read.starts]
            out += [tokenize_state(self.tokenizer, text) for text in texts]
        return out, plans

    def swap(self, runtime: Runtime, choice: Choice | None) -> None:
        """Answer with `runtime` from the next batch on (auto's background upgrade): a batch under way
        finishes on the runtime it started with, since `answer` reads the runtime once per batch."""
        self.runtime, self.choice = runtime, choice

    def run(self, rows: list[Row], alive: Callable[[int], bool] | None = None, runtime: Runtime | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Logits (cut to each row's options) and act logits of `rows`.

        Rows are batched by their canonical padded length (`padded_length`), at most
        `max_batch_rows` at a time, so each row is computed the same way whatever shares its batch.
        `alive(i)` is asked before each forward pass: rows whose caller went away are skipped. `runtime`
        (default: the model's now) runs every forward pass of the call.
        """
        runtime = runtime or self.runtime
        groups: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(padded_length(len(row.ids)), []).append(i)
        logits: list[np.ndarray] = [np.empty(0)] * len(rows)
        acts: list[np.ndarray] = [np.empty(0)] * len(rows)
        for length, members in sorted(groups.items()):
            for start in range(0, len(members), self.max_batch_rows):
                chunk = members[start : start + self.max_batch_rows]
                if alive is not None:
                    chunk = [i for i in chunk if alive(i)]
                    if not chunk:
                        continue
                batch = collate([rows[i] for i in chunk], self.tokenizer.pad_id, length=length)
                out_logits, out_act = runtime.forward(batch)
                for j, i in enumerate(chunk):
                    logits[i] = out_logits[j, : len(rows[i].markers)]
                    acts[i] = out_act[j]
        return logits, acts

    def _compacted(self, q: Question, state: StateTokens, row: Row) -> Row:
        """Compact mode (a runtime option, e.g. Core ML's `compact=True`): a row longer than the runtime's
        compact length is shortened to fit it, when its options fit the runtime's slots."""
        compact = self.runtime.compact()
        if compact is None or q.n_options > compact.slots:
            return row
        return compact_row(self.tokenizer, q, state, compact.length, self.head_max_len, row)

    def tempered(self, q: Question, z: np.ndarray) -> np.ndarray:
        return decode.probabilities(z, self.temperatures.for_question(q.qtype, q.n_options))

    def respond(self, questions: list[Question], rows: list[Row], logits, acts,
                tournaments: Mapping[str, Played] | None = None, precision: str | None = None
                ) -> SystemOneResponse:
        """The System One response of one state. `rows`/`logits`/`acts` are the one-row questions', in
        order; `tournaments` holds each tournament question's game, final row and every row it took;
        `precision` is that of the runtime that computed them (default: the model's now)."""
        answers = {}
        one_row = iter(zip(logits, acts))
        tournaments = tournaments or {}
        rows_of = dict(zip([q.qid for q in questions if q.qid not in tournaments], [[r] for r in rows]))
        for qid, game in tournaments.items():
            rows_of[qid] = game.rows
        for q in questions:
            if q.qid in tournaments:
                played, z, a = tournaments[q.qid].tournament, tournaments[q.qid].logits, tournaments[q.qid].act
                final = self.tempered(played.finalists(), z)
                p = played.shares(final)
                extras = {**self._act(a), "x_tournament": played.report(final)}
            else:
                z, a = next(one_row)
                p = self.tempered(q, z)
                extras = self._act(a)
            if self.calibration is not None:  # prediction set, abstention
                extras |= self.calibration.extras(q.keys, q.qtype, p, extras.get("x_act_probability"))
            answer = decode.answer(q, p, extras)
            if self.binning and answer.answer_confidence is not None:
                answer.answer_confidence = apply_binning(answer.answer_confidence,
                                                         bucket_key(q.qtype, q.n_options), self.binning)
            answers[q.qid] = answer
        input_tokens, usage = row_usage(questions, rows_of)
        return SystemOneResponse(model=self.name, answers=answers, input_tokens=input_tokens, x_usage=usage,
                                 precision=precision or self.runtime.precision)

    def _act(self, act_logits: np.ndarray) -> dict[str, Any]:
        """The act head's abstain probability, or null with the reason where the model has no act head."""
        if not self.checkpoint.config.act_head:
            return {"x_act_probability": None, "x_act_reason": NO_ACT_HEAD}
        return {"x_act_probability": decode.act_probability(act_logits)}

    def predict_batch(self, states: Sequence[Any], questions: Mapping[str, Any], tournament: int | None = None,
                      *, min_confidence: Threshold | None = None, overflow: Overflow = None, order: str = AS_GIVEN,
                      strict: bool = False) -> list[dict[str, Any]]:
        """The same questions over many states, sharing forward passes, with the options of a System One
        request (docs/request-options.md): `min_confidence` gates every answer as upstream does
        (`laya.structured.gate`); `overflow` as in `prepare`; `order` reads each choice in those option
        orders and averages them (`x_order`: "both", "rotate:K"); a choice's `x_shortlist` is answered on
        its K options nearest the state, as the server answers it; `strict` keeps to the contract's fields."""
        if isinstance(states, str | bytes | dict):
            raise QuestionError("predict_batch takes a list of states; use predict() for one state")
        threshold = check_min_confidence(min_confidence)
        check_strict(threshold, strict)
        states = list(states)
        if not states:
            return []
        request = Request.of(states, questions, tournament=tournament, overflow=overflow, order=order)
        out = [r.to_json(strict) for r in self.answer_request(request)]
        apply_gate(out, threshold)
        return out

    def answer_request(self, request: Request) -> list[SystemOneResponse]:
        """A validated request's responses, its `x_shortlist` choices narrowed and its `x_order` parts
        read in one batch, as the encoder engine answers it (without the server's limits)."""
        def one(part: Request) -> Prepared:
            part, kept = shortlist_request(self, part)
            job = self.prepare_request(part)
            job.shortlists = kept
            return job

        return execute_in_orders([prepare_in_orders(request, one, carry_all=False)], self.answer)[0]

    def answer(self, jobs: list[Prepared]) -> list[list[SystemOneResponse]]:
        """Responses of several prepared requests, their rows sharing forward passes (the rounds of
        every tournament of every request too), each shortlisted choice's answer over every option asked.
        One runtime answers all of them: the one in place when the call began (a swap meanwhile takes
        effect at the next call)."""
        runtime = self.runtime
        played = self._play(jobs, runtime)
        out = self._per_state(jobs, lambda job, rows, z, a, key: self.respond(
            job.questions, rows, z, a, played.get(key), runtime.precision), runtime)
        for job, responses in zip(jobs, out):
            for response in responses if job.shortlists else ():
                for qid, (said, keys) in job.shortlists.items():
                    response.answers[qid] = widened(response.answers[qid], said, keys)
        return [_read_whole(job, responses) for job, responses in zip(jobs, out)]

    def _play(self, jobs: list[Prepared], runtime: Runtime) -> dict[tuple[int, int], dict[str, Played]]:
        """Every tournament of every (request, state), by qid. All rounds of all tournaments share
        forward passes, round by round; a request cancelled meanwhile plays no further round."""
        games = [(j, s, Tournament(q, job.tournaments[q.qid]))
                 for j, job in enumerate(jobs) for s in range(len(job.states))
                 for q in job.questions if q.qid in job.tournaments]
        if not games:
            return {}
        tok = self.tokenizer
        taken: dict[int, list[Row]] = {}
        heads: dict[tuple[int, str, tuple[str, ...]], QuestionTokens] = {}  # a group's head serves every state

        def row_of(question: Question, game) -> Row:
            j, s, t = game
            key = (j, question.qid, question.keys)
            if key not in heads:
                heads[key] = self.head_of(question)
            row = build_row(tok, question, heads[key], jobs[j].states[s], self.max_len)
            taken.setdefault(id(t), []).append(row)
            return row

        def alive(games_now) -> list:
            return [g for g in games_now if not jobs[g[0]].cancelled.is_set()]

        pending = alive([g for g in games if not g[2].done])
        while pending:
            asked = [(g, q) for g in pending for q in g[2].next_round()]
            logits, _ = self.run([row_of(q, g) for g, q in asked], runtime=runtime)
            for g in pending:
                g[2].record([self.tempered(q, z) for (h, q), z in zip(asked, logits) if h is g])
            pending = alive([g for g in pending if not g[2].done])
        live = alive(games)
        logits, acts = self.run([row_of(g[2].finalists(), g) for g in live], runtime=runtime)
        out: dict[tuple[int, int], dict[str, Played]] = {}
        for (j, s, t), z, a in zip(live, logits, acts):
            out.setdefault((j, s), {})[t.question.qid] = Played(t, z, a, taken[id(t)])
        return out

    def evidence(self, jobs: list[Prepared]) -> list[list[list[Evidence]]]:
        """Per request, per state, per question: the untempered option logits and the act probability
        (what calibration fits on), the rows of all requests sharing forward passes."""
        for job in jobs:
            if job.tournaments:
                qid = next(iter(job.tournaments))
                raise QuestionError(f"question {qid!r}: calibration reads every question in one row, and this "
                                    "choice's options do not fit in the model's row", qid=qid)
        return self._per_state(jobs, lambda job, rows, z, a, key: [
            Evidence.single(q.qtype, zi, decode.act_probability(ai)) for q, zi, ai in zip(job.questions, z, a)])

    def _per_state(self, jobs: list[Prepared], make: Callable[..., Any], runtime: Runtime | None = None
                   ) -> list[list]:
        """Run every row of `jobs` together, then `make(job, rows, logits, acts, (job, state) index)`
        once per state.

        A job cancelled meanwhile (its caller went away) stops costing forward passes; it gets no
        answers (an empty list)."""
        flat = [row for job in jobs for rows in job.rows for row in rows]
        owner = [j for j, job in enumerate(jobs) for rows in job.rows for _ in rows]
        logits, acts = self.run(flat, alive=lambda i: not jobs[owner[i]].cancelled.is_set(), runtime=runtime)
        out, at = [], 0
        for j, job in enumerate(jobs):
            per_state = []
            for s, rows in enumerate(job.rows):
                n = len(rows)
                if not job.cancelled.is_set():
                    per_state.append(make(job, rows, logits[at : at + n], acts[at : at + n], (j, s)))
                at += n
            out.append(per_state)
        return out

    def predict(self, state: Any, questions: Mapping[str, Any], tournament: int | None = None, *,
                min_confidence: Threshold | None = None, overflow: Overflow = None, order: str = AS_GIVEN,
                strict: bool = False) -> dict[str, Any]:
        """One state, many questions: `{"model", "answers", "usage", "x_usage"}`. `tournament=G`
        answers every choice of more than G options by elimination in groups of G; the other options are
        `predict_batch`'s."""
        return self.predict_batch([state], questions, tournament=tournament, min_confidence=min_confidence,
                                  overflow=overflow, order=order, strict=strict)[0]

    def predict_long(self, state: Any, questions: Mapping[str, Any], window: int | None = None,
                     stride: int | None = None, aggregate: str = "auto") -> dict[str, Any]:
        """A state longer than the row, read in overlapping windows in shared forward passes, as
        upstream's `predict_long` reads it (`laya.encoder.windows`): each answer is its deciding
        window's, named in `x_window`; `x_usage.windows` counts the windows read."""
        if state is None:
            raise QuestionError("state must not be None; pass a string, dict, or list", error_type="invalid_state")
        return self.predict(state, questions, overflow=Scan(window, stride, aggregate))

    def decide(self, state: Any, schema: Any = None, *, questions: Mapping[str, Any] | None = None,
               return_details: bool = False, min_confidence: Threshold | None = None,
               tournament: int | None = None) -> Any:
        """The values of `schema` (a JSON schema or a pydantic model) decided from `state`, as
        upstream's `laya.decide`: choices give their enum values, yes/no a bool, scores an int;
        `return_details=True` gives a `DecisionResult`. With `questions=` instead, the raw answers."""
        return self.decide_batch([state], schema, questions=questions, return_details=return_details,
                                 min_confidence=min_confidence, tournament=tournament)[0]

    def decide_batch(self, states: Sequence[Any], schema: Any = None, *, questions: Mapping[str, Any] | None = None,
                     return_details: bool = False, min_confidence: Threshold | None = None,
                     tournament: int | None = None) -> list[Any]:
        """`decide` over many states, the schema planned once and every state in shared forward passes."""
        if (schema is None) == (questions is None):
            raise QuestionError("pass exactly one of schema= or questions=", error_type="invalid_schema")
        if isinstance(states, str | bytes) or not isinstance(states, Sequence):
            raise QuestionError(f"states must be a sequence of states, not {type(states).__name__}",
                                error_type="invalid_state")
        threshold = check_min_confidence(min_confidence)
        fields = plan_schema(schema) if schema is not None else None
        asked = questions_of([f for f in fields if not f.certain]) if fields is not None else dict(questions or {})
        states = list(states)
        if asked:
            responses = self.predict_batch(states, asked, tournament=tournament)
        else:  # every field has one possible value: nothing to read
            for state in states:
                check_state(state)
            responses = [{"model": self.name, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}
                         for _ in states]
        out = []
        for response in responses:
            if fields is not None:
                values = settle(response, fields, threshold)
            else:
                apply_gate([response], threshold)
                values = dict(response["answers"])
            out.append(details(values, response) if return_details else values)
        return out

    def info(self) -> dict[str, Any]:
        ck = self.checkpoint
        enc = ck.encoder
        return {
            "name": self.name,
            "source": ck.source,
            "path": str(ck.path),
            "runtime": self.runtime.name,
            "precision": self.runtime.precision,
            "runtime_choice": self.choice.to_dict() if self.choice else None,
            "gate": self.runtime.info().gate,
            **({"upgrade": self.upgrade.status()} if self.upgrade else {}),
            "encoder": {
                "id": ck.config.encoder,
                "layers": enc.num_hidden_layers,
                "hidden_size": enc.hidden_size,
                "heads": enc.num_attention_heads,
                "intermediate_size": enc.intermediate_size,
                "vocab_size": enc.vocab_size,
                "rope_theta": {"global": enc.global_rope_theta, "local": enc.local_rope_theta},
                "local_attention": enc.local_attention,
            },
            "parameters": ck.n_parameters,
            "head_layers": ck.config.head_layers,
            "max_len": ck.config.max_len,
            "head_max_len": ck.config.head_max_len,
            "temperatures": self.temperatures.to_dict(),
            "special_ids": {
                "cls": ck.tokenizer.cls_id, "sep": ck.tokenizer.sep_id,
                "mask": ck.tokenizer.mask_id, "pad": ck.tokenizer.pad_id,
            },
        }
