"""What a prepared request will take on the encoder, told before any forward pass (`laya plan`,
`POST /v1/systemone/plan`): per state and per question the rows and tokens, how much of the state
each row keeps and which end it drops, a tournament's rounds.

Everything here is read off the `Prepared` job the forward pass would run, through the same
`row_usage` and `merged_usage` an answer's `x_usage` comes from, so the plan cannot drift from
what is then used. The one figure it cannot know is a tournament's later rounds: which options
meet there depends on the answers of the first, so their rows are counted exactly and their tokens
only as at most a full row each (`input_tokens_exact` is then false).
"""

from __future__ import annotations

from typing import Any

from laya.encoder.model import Model, Prepared, row_usage
from laya.encoder.rows import Row, StateTokens, build_row
from laya.encoder.windows import Windows, merged_usage
from laya.questions import Question
from laya.tournament import groups_of, narrowed, tournament_rows


def tokens_per_option(row: Row) -> list[int]:
    """Each option's tokens in the row, its [MASK] marker not counted (the question half ends with a
    [SEP] after the last option)."""
    ends = [*row.markers[1:], row.head_tokens - 1]
    return [end - start - 1 for start, end in zip(row.markers, ends)]


def _question(q: Question, rows: list[Row], later: int, max_len: int, group: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": q.qtype, "options": q.n_options, "rows": len(rows) + later,
                           "tokens": sum(len(r.ids) for r in rows) + later * max_len,
                           "question_tokens": sum(r.head_tokens for r in rows),
                           "state_tokens_kept": min(r.state_tokens_kept for r in rows)}
    if q.qtype == "choice":
        out["tokens_per_option"] = [n for r in rows for n in tokens_per_option(r)]
    if group:
        first = len(rows)
        out["tournament"] = {"group": group, "first_round_rows": first, "later_rows": later,
                             "later_tokens_at_most": later * max_len}
    if rows[0].compacted:
        out["compacted"] = dict(rows[0].compacted)
    return out


def _one_state(model: Model, job: Prepared, rows: list[Row], state: StateTokens
               ) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]], bool]:
    """input_tokens (at most, with tournaments), x_usage and the questions' entries of one row set."""
    plain = iter(rows)
    rows_of: dict[str, list[Row]] = {}
    later: dict[str, int] = {}
    for q in job.questions:
        group = job.tournaments.get(q.qid)
        if not group:
            rows_of[q.qid] = [next(plain)]
            continue
        # the first round is known: its groups are the options in order
        rows_of[q.qid] = [build_row(model.tokenizer, part, model.head_of(part), state, model.max_len)
                          for part in (narrowed(q, g) for g in groups_of(list(range(q.n_options)), group))]
        later[q.qid] = tournament_rows(q.n_options, group) - len(rows_of[q.qid])
    tokens, usage = row_usage(job.questions, rows_of)
    extra = sum(later.values())
    usage["rows"] += extra
    questions = {q.qid: _question(q, rows_of[q.qid], later.get(q.qid, 0), model.max_len, job.tournaments.get(q.qid))
                 for q in job.questions}
    return tokens + extra * model.max_len, usage, questions, not later


def plan_states(model: Model, job: Prepared) -> tuple[list[dict[str, Any]], bool]:
    """Per state of the request, what its answer's `input_tokens` and `x_usage` will say, with which end
    of the state is dropped and each question's rows; and whether every token figure is exact."""
    exact = True
    singles = []
    for rows, state in zip(job.rows, job.states):
        tokens, usage, questions, known = _one_state(model, job, rows, state)
        exact &= known
        singles.append((tokens, usage, questions, state))
    reads: list[Windows | None] = []
    reads += job.windows or [None] * len(singles)
    qids = [q.qid for q in job.questions]
    out, at = [], 0
    for read in reads:
        count = read.count if read is not None else 1
        part, at = singles[at : at + count], at + count
        tokens = sum(p[0] for p in part)
        usage = part[0][1] if read is None else merged_usage(read, [p[1] for p in part], qids)
        questions = part[0][2] if count == 1 else _summed([p[2] for p in part])
        dropped = usage["state_tokens_dropped"] > 0
        out.append({"input_tokens": tokens, **usage,
                    "dropped": ("start" if part[0][3].keep_end else "end") if dropped and read is None else None,
                    "questions": questions})
    return out, exact


def _summed(per_window: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """A scanned state's question entries: rows, tokens and state kept summed over its windows."""
    out = {qid: dict(entry) for qid, entry in per_window[0].items()}
    for window in per_window[1:]:
        for qid, entry in window.items():
            for key in ("rows", "tokens", "question_tokens", "state_tokens_kept"):
                out[qid][key] += entry[key]
    return out
