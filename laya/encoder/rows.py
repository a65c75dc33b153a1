"""Building the encoder row of one question over one state, exactly as upstream laya does.

    [CLS] <type> question: <instructions> [SEP] [MASK] opt0 [MASK] opt1 ... [SEP] <state> [SEP]

The question half (the "head") depends only on the question, the state half only on the state, so
a request tokenises its state once and each question's head once, then joins them per row.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

from laya.encoder.tokenizer import Tokenizer
from laya.errors import QuestionError
from laya.questions import Question, serialize_state

OPTION_TOKEN_CAP = 48  # tokens of one option text, the [MASK] not included
OPTIONS_MIN_LEFT = 16  # below this many tokens left for the instructions, options are cut
OPTION_FLOOR = 4  # tokens an option keeps at the very least, its [MASK] included
INSTRUCTIONS_FLOOR = 8  # tokens the instructions keep at the very least


@dataclass(frozen=True)
class QuestionTokens:
    """The question half of a row, tokenised once per question (the state half is `StateTokens`)."""

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    tokens_per_option: int | None


@dataclass(frozen=True)
class StateTokens:
    """A state tokenised once; `keep_end` for conversations (lists), whose newest turn is last."""

    ids: tuple[int, ...]
    keep_end: bool


@dataclass(frozen=True)
class Row:
    """One encoder row: ids, the [MASK] position of each option, and what the state lost."""

    ids: tuple[int, ...]
    markers: tuple[int, ...]
    qtype: int
    state_tokens: int
    state_tokens_kept: int
    head_tokens: int
    compacted: tuple[tuple[str, int], ...] = ()  # what compact mode dropped: (what, how many), never silent

    @property
    def state_tokens_dropped(self) -> int:
        return self.state_tokens - self.state_tokens_kept


def build_head(tok: Tokenizer, question: Question, head_max_len: int) -> QuestionTokens:
    """The question half; `head_max_len` is a cap the floors may exceed with very many options."""
    q = tok.encode(f"{question.qtype} question: {tok.sanitize(question.instructions)}")
    texts = [" " + tok.sanitize(text) for text in question.options]
    opts = [[tok.mask_id, *ids[:OPTION_TOKEN_CAP]] for ids in tok.encode_many(texts)]
    left = head_max_len - sum(len(o) for o in opts)
    per_option = None
    if left < OPTIONS_MIN_LEFT:
        per_option = max(OPTION_FLOOR, (head_max_len - OPTIONS_MIN_LEFT) // len(opts))
        opts = [o[:per_option] for o in opts]
        left = head_max_len - sum(len(o) for o in opts)
    q = q[: max(INSTRUCTIONS_FLOOR, left)]
    ids = [tok.cls_id, *q, tok.sep_id]
    markers = []
    for o in opts:
        markers.append(len(ids))
        ids.extend(o)
    ids.append(tok.sep_id)
    return QuestionTokens(
        ids=tuple(ids),
        markers=tuple(markers),
        tokens_per_option=per_option,
    )


class HeadCache:
    """Question halves by what they are built from (type, instructions, options), least recently used
    out first: routers ask the same few questions of every state, and tokenising a question's
    instructions and options is most of what preparing a request costs."""

    def __init__(self, tok: Tokenizer, head_max_len: int, size: int = 1024):
        self.tok, self.head_max_len, self.size = tok, head_max_len, size
        self._heads: OrderedDict[tuple, QuestionTokens] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, question: Question) -> QuestionTokens:
        key = (question.qtype, question.instructions, question.options)
        with self._lock:
            head = self._heads.get(key)
            if head is not None:
                self._heads.move_to_end(key)
                return head
        head = build_head(self.tok, question, self.head_max_len)
        with self._lock:
            self._heads[key] = head
            while len(self._heads) > self.size:
                self._heads.popitem(last=False)
        return head


def tokenize_state(tok: Tokenizer, state: object) -> StateTokens:
    return StateTokens(ids=tuple(tok.encode(tok.sanitize(serialize_state(state)))), keep_end=isinstance(state, list))


def build_row(tok: Tokenizer, question: Question, head: QuestionTokens, state: StateTokens, max_len: int) -> Row:
    """Join a head and a state into one row of at most `max_len` tokens.

    Refuses (rather than silently answering from fewer options) a question whose option markers
    do not all fit in `max_len`.
    """
    fitting = sum(1 for m in head.markers if m < max_len)
    if fitting < len(head.markers):
        raise QuestionError(
            f"question {question.qid!r}: only {fitting} of its {len(head.markers)} option markers fit in "
            f"the model's row of {max_len} tokens; use fewer or shorter options",
            qid=question.qid,
            error_type="question_too_long",
        )
    room = max(0, max_len - len(head.ids) - 1)
    ids = state.ids
    # not ids[-room:]: with no room, ids[-0:] would be the whole state
    kept = ids[max(0, len(ids) - room) :] if state.keep_end else ids[:room]
    row = (*head.ids, *kept, tok.sep_id)[:max_len]
    return Row(
        ids=row,
        markers=head.markers,
        qtype=question.qtype_index,
        state_tokens=len(ids),
        state_tokens_kept=len(kept),
        head_tokens=len(head.ids),
    )


def build_rows(tok: Tokenizer, state: object, questions: list[Question], max_len: int, head_max_len: int) -> list[Row]:
    """Rows of one state, one per question."""
    state_tokens = tokenize_state(tok, state)
    return [build_row(tok, q, build_head(tok, q, head_max_len), state_tokens, max_len) for q in questions]


def compact_row(tok: Tokenizer, question: Question, state: StateTokens, length: int, head_max_len: int,
                row: Row) -> Row:
    """`row` shortened to at most `length` tokens (compact prompts for fixed-shape programs), or `row`
    itself when it fits or cannot be made to: option descriptions go first (a choice is then read by
    its option names), then the state, by the checkpoint's own truncation rule (the start of text and
    objects is kept, the newest end of a conversation). What was dropped is recorded on the row."""
    if len(row.ids) <= length:
        return row
    dropped: list[tuple[str, int]] = []
    head = build_head(tok, question, head_max_len)
    if question.qtype == "choice" and any(d is not None for d in question.descriptions):
        bare = replace(question, options=question.names, descriptions=(None,) * question.n_options)
        head = build_head(tok, bare, head_max_len)
        dropped.append(("option_descriptions", sum(d is not None for d in question.descriptions)))
        question = bare
    if len(head.ids) + 1 > length:  # even the question half does not fit: the exact row stays
        return row
    short = build_row(tok, question, head, state, length)
    lost = short.state_tokens_dropped - row.state_tokens_dropped
    if lost:
        dropped.append(("state_tokens", lost))
    return replace(short, compacted=tuple(dropped))
