"""A loaded laya model: checkpoint + runtime + policy, answering System One requests.

The straight line of one request: questions are validated once, the state is tokenised once,
each question's head is built once, rows go through the runtime in padded batches, and each row
of logits is decoded with its bucket's temperature.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya.calibration.evidence import Evidence
from laya.calibration.file import Calibration
from laya.calibration.temperatures import Temperatures
from laya.checkpoint import Checkpoint
from laya.encoder.batch import collate, padded_length
from laya.encoder.rows import Head, Row, build_head, build_rows
from laya.errors import QuestionError
from laya.heads import decode
from laya.questions import Question, check_state, parse_questions
from laya.runtimes.base import Runtime

DEFAULT_MAX_BATCH_ROWS = 32


@dataclass
class Prepared:
    """A request after validation and row building, before any runtime call.

    `cancelled` is set when the caller went away: its rows not yet run are skipped."""

    questions: list[Question]
    rows: list[list[Row]]  # per state, one row per question
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def n_rows(self) -> int:
        return sum(len(rows) for rows in self.rows)

    @property
    def n_tokens(self) -> int:
        return sum(len(row.ids) for rows in self.rows for row in rows)


class Model:
    """`laya.load(...)` returns one of these; `predict` answers one state, `predict_batch` many."""

    def __init__(
        self, checkpoint: Checkpoint, runtime: Runtime, *, name: str | None = None,
        temperatures: Temperatures | None = None, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS,
        calibration: Calibration | None = None,
    ):
        self.checkpoint = checkpoint
        self.runtime = runtime
        self.name = name or checkpoint.path.name
        cfg = checkpoint.config
        self.temperatures = temperatures or Temperatures.from_raw(
            cfg.temperature, cfg.temperature_by_options, source=str(checkpoint.path / "rl_agent_config.json")
        )
        self.max_batch_rows = max_batch_rows
        self.calibration = calibration
        self.abstention = calibration.abstention if calibration else None
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

    def prepare(self, states: Sequence[Any], questions: Mapping[str, Any]) -> Prepared:
        """Validate and build every row; raises `QuestionError` before any inference."""
        parsed = parse_questions(questions)
        for state in states:
            check_state(state)
        heads: dict[str, Head] = {q.qid: build_head(self.tokenizer, q, self.head_max_len) for q in parsed}
        rows = [build_rows(self.tokenizer, s, parsed, self.max_len, self.head_max_len, heads) for s in states]
        return Prepared(questions=parsed, rows=rows)

    def run(self, rows: list[Row], alive: Callable[[int], bool] | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Logits (cut to each row's options) and act logits of `rows`.

        Rows are batched by their canonical padded length (`padded_length`), at most
        `max_batch_rows` at a time, so each row is computed the same way whatever shares its batch.
        `alive(i)` is asked before each forward pass: rows whose caller went away are skipped.
        """
        groups: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(padded_length(len(row.ids)), []).append(i)
        logits: list[np.ndarray] = [np.empty(0)] * len(rows)
        acts: list[np.ndarray] = [np.empty(0)] * len(rows)
        for length, members in sorted(groups.items()):
            if alive is not None:
                members = [i for i in members if alive(i)]
            for start in range(0, len(members), self.max_batch_rows):
                chunk = members[start : start + self.max_batch_rows]
                if alive is not None:
                    chunk = [i for i in chunk if alive(i)]
                    if not chunk:
                        continue
                batch = collate([rows[i] for i in chunk], self.tokenizer.pad_id, length=length)
                out_logits, out_act = self.runtime.forward(batch)
                for j, i in enumerate(chunk):
                    logits[i] = out_logits[j, : len(rows[i].markers)]
                    acts[i] = out_act[j]
        return logits, acts

    def respond(self, questions: list[Question], rows: list[Row], logits, acts) -> dict[str, Any]:
        """The System One response of one state."""
        answers = {}
        for q, z, a in zip(questions, logits, acts):
            t = self.temperatures.for_question(q.qtype, q.n_options)
            p = decode.probabilities(z, t)
            extras = {"x_act_probability": decode.act_probability(a)}
            if self.abstention is not None:
                extras |= self.abstention.extras(q.qtype, q.n_options, p)
            answers[q.qid] = decode.answer(q, p, extras)
        return {
            "model": self.name,
            "answers": answers,
            "usage": {"input_tokens": int(sum(len(r.ids) for r in rows)), "output_tokens": 0},
            "x_usage": {
                "state_tokens": rows[0].state_tokens,
                "state_tokens_kept": min(r.state_tokens_kept for r in rows),
                "state_tokens_dropped": max(r.state_tokens_dropped for r in rows),
                "truncated_questions": [q.qid for q, r in zip(questions, rows) if r.state_tokens_dropped],
                "rows": len(rows),
            },
        }

    def predict_batch(self, states: Sequence[Any], questions: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The same questions over many states, sharing forward passes."""
        if isinstance(states, str | bytes | dict):
            raise QuestionError("predict_batch takes a list of states; use predict() for one state")
        states = list(states)
        if not states:
            return []
        return self.answer([self.prepare(states, questions)])[0]

    def answer(self, jobs: list[Prepared]) -> list[list[dict[str, Any]]]:
        """Responses of several prepared requests, their rows sharing forward passes."""
        return self._per_state(jobs, lambda job, rows, z, a: self.respond(job.questions, rows, z, a))

    def evidence(self, jobs: list[Prepared]) -> list[list[list[Evidence]]]:
        """Per request, per state, per question: the untempered option logits and the act probability
        (what calibration fits on), the rows of all requests sharing forward passes."""
        return self._per_state(jobs, lambda job, rows, z, a: [
            Evidence.single(q.qtype, zi, decode.act_probability(ai)) for q, zi, ai in zip(job.questions, z, a)])

    def _per_state(self, jobs: list[Prepared], make: Callable[[Prepared, list[Row], list, list], Any]) -> list[list]:
        """Run every row of `jobs` together, then `make(job, rows, logits, acts)` once per state.

        A job cancelled meanwhile (its caller went away) stops costing forward passes; it gets no
        answers (an empty list)."""
        flat = [row for job in jobs for rows in job.rows for row in rows]
        owner = [j for j, job in enumerate(jobs) for rows in job.rows for _ in rows]
        logits, acts = self.run(flat, alive=lambda i: not jobs[owner[i]].cancelled.is_set())
        out, at = [], 0
        for job in jobs:
            per_state = []
            for rows in job.rows:
                n = len(rows)
                if not job.cancelled.is_set():
                    per_state.append(make(job, rows, logits[at : at + n], acts[at : at + n]))
                at += n
            out.append(per_state)
        return out

    def predict(self, state: Any, questions: Mapping[str, Any]) -> dict[str, Any]:
        """One state, many questions: `{"model", "answers", "usage", "x_usage"}`."""
        return self.predict_batch([state], questions)[0]

    def info(self) -> dict[str, Any]:
        ck = self.checkpoint
        enc = ck.encoder
        return {
            "name": self.name,
            "source": ck.source,
            "path": str(ck.path),
            "runtime": self.runtime.name,
            "precision": self.runtime.precision,
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
