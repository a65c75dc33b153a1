"""How long a request's work may take on a served model: what its default deadline follows.

A fixed deadline refuses valid requests on a slow machine: a 255-option choice over a state as long as
the row is a tournament of 17 full rows for an encoder (about 40 s of torch fp32 on two cores for the
mmBERT-base shape), and a chat model's longest prompt is its whole context. So the server's deadline
(`--request-timeout-s`) is a floor, and a request whose work needs longer at the model's measured
speed gets that long (`ServerConfig.deadline_follows_work`; a client's shorter `X-Laya-Timeout-S` is
kept as asked).

The bound is worked out where the request is admitted, before the model prepares it (in the engine
process): from the request itself and the model's speed, measured when it warmed up and reported in
its description (`speed`). It bounds the work from above without a tokenizer:
- encoder: rows, each at most the model's row (`max_len` tokens, the row the speed was measured on):
  a tournament's every group and final row for each choice of more options than a group (whether or
  not its markers fit one row), every order of `x_order`, a scan's windows;
- decide engine: prompt tokens, each at most a byte of the text it reads (byte-level and byte-fallback
  tokenizers never make more tokens than bytes) plus each option's and prompt's formatting, at the
  per-token cost of a prefill as long as the whole context: the state once (its prefix is kept) or
  once per decision (`reuse_prefix` false), each question's prompt, and where the prompt could
  overflow the context a tournament of groups of two (every round's options and each group's
  instructions).
Both are capped by the server's own limits (a request past them is refused, never run). The allowance
is `WORK_FACTOR` times that: a bound measured on an idle machine holds on a busy one.
"""

from __future__ import annotations

import json
import math
from typing import Any

from laya.limits import Limits
from laya.orders import permutations
from laya.questions import Question
from laya.request import AS_GIVEN, Request, Scan
from laya.tournament import DEFAULT_GROUP, tournament_rows

WORK_FACTOR = 4.0  # the allowance over the measured bound: the machine may be busier than at warm-up
SCAN_MIN_STEP = 16  # tokens a scan advances at the least, unless the request names its own stride
PROMPT_TOKENS = 256  # a chat prompt's template, instructions' frame and answer cue, at most
OPTION_TOKENS = 8  # an option's formatting in a chat prompt (its letter, separators), at most


def _bytes(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass"))


def _orders(request: Request) -> int:
    """How many times the request's choices are read (`x_order`)."""
    if request.options.order == AS_GIVEN:
        return 1
    widest = max((q.n_options for q in request.questions if q.qtype == "choice"), default=1)
    return len(permutations(request.options.order, max(2, widest)))


def encoder_rows(request: Request, max_len: int, limits: Limits) -> int:
    """Rows the request may take on an encoder with rows of `max_len` tokens, at most the server's limit."""
    group = request.options.tournament or DEFAULT_GROUP
    per_state = sum(tournament_rows(q.n_options, group) if q.qtype == "choice" and q.n_options > group else 1
                    for q in request.questions)
    embedded = sum(-(-(q.n_options + 1) // DEFAULT_GROUP) for q in request.questions if q.shortlist is not None)
    scan = request.options.overflow
    rows = 0
    for state in request.states:
        windows = 1
        if isinstance(scan, Scan):
            step = scan.stride if scan.stride is not None and scan.stride > 0 else SCAN_MIN_STEP
            windows = 1 + math.ceil(_bytes(state) / step)
        rows += windows * per_state * _orders(request) + embedded
    return min(rows, limits.max_rows)


def _question_tokens(q: Question) -> int:
    return (_bytes(q.instructions) + PROMPT_TOKENS
            + sum(_bytes(o) + OPTION_TOKENS for o in q.options))


def decide_tokens(request: Request, n_ctx: int, limits: Limits) -> int:
    """Prompt tokens the request may read on a chat model of context `n_ctx`, at most the server's limit."""
    reuse = request.options.reuse_prefix
    total = 0
    for state in request.states:
        prefix = min(n_ctx, _bytes(state) + PROMPT_TOKENS)
        total += prefix
        for q in request.questions:
            whole = prefix + _question_tokens(q)
            asked = request.options.tournament
            if q.qtype == "choice" and (whole > n_ctx or (asked is not None and q.n_options > asked)):
                group = asked or 2
                decisions, rounds, n = tournament_rows(q.n_options, group), 1, q.n_options
                while n > group:
                    n, rounds = -(-n // group), rounds + 1
                options = sum(_bytes(o) + OPTION_TOKENS for o in q.options)
                read = decisions * (_bytes(q.instructions) + PROMPT_TOKENS) + rounds * options
                total += read + (0 if reuse else decisions * prefix)
            else:
                reads = 2 * _orders(request)  # both orders of a yes/no, or each order of a choice
                total += reads * (min(n_ctx, whole) if not reuse else min(n_ctx, _question_tokens(q)))
    return min(total, limits.max_tokens)


def work_s(request: Request, speed: dict[str, Any] | None, limits: Limits) -> float:
    """Seconds the request's work may take on a model with this measured `speed` (its description's):
    the bound times `WORK_FACTOR`; 0 where the model measured none."""
    if not speed:
        return 0.0
    if "row_s" in speed:
        return WORK_FACTOR * encoder_rows(request, int(speed["max_len"]), limits) * float(speed["row_s"])
    if "token_s" in speed:
        return WORK_FACTOR * decide_tokens(request, int(speed["n_ctx"]), limits) * float(speed["token_s"])
    return 0.0


def describe_work(request: Request, speed: dict[str, Any] | None, limits: Limits) -> str:
    """The work the allowance was worked out for, in its own units (for the 504's message)."""
    if speed and "row_s" in speed:
        rows = encoder_rows(request, int(speed["max_len"]), limits)
        return f"up to {rows} rows of {speed['max_len']} tokens at {float(speed['row_s']):.3g} s a row"
    if speed and "token_s" in speed:
        tokens = decide_tokens(request, int(speed["n_ctx"]), limits)
        return f"up to {tokens} prompt tokens at {float(speed['token_s']) * 1000:.3g} ms a token"
    return "no measured speed"
