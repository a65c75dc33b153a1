"""Readout profiles: how one GGUF is asked a System One question and how its answer is read.

A model answers well only in the layout it was trained on (seed 001: the same decider file scores
62 of 67 read at its answer slot and 55 read inside a JSON object), so the layout is chosen per
model, by its metadata or by the operator (`laya.decide.metadata`):

- `first-token` (chat models, the default): the state and the question as one user message under
  the model's chat template, each option scored by its name's first tokens (`laya.decide.prompts`).
- `answer-slot` (dohnuts' decider profile, for decision-trained models): no chat template; the
  raw row `Context:\\n<state>` then `\\n\\nQuestion: ...\\nOptions:\\n(A) name: description ...
  \\nAnswer: (`, the two parts tokenised separately and joined, the option letters' logits divided
  by the model's own temperature (from its metadata): calibrated as the model was.
- `json-field` (pcdServer's first-token scoring inside a JSON object, for chat models): a fixed
  system turn listing every field and its allowed values, the state as the user turn, the
  assistant turn opening the object; each question is the member prefix `"qid": "` after it, scored
  over the first tokens of its allowed values, level by level through the collision tree where
  they share beginnings. The system turn depends only on the fields: its state is kept and
  restored exactly for the next request with the same fields. A raw softmax: uncalibrated.
- `letters` (slot's Hmm readout): the state, the question and `A: name — description` lines in one
  user turn ending `Return only the option letter.`; an option's probability is the mass of every
  top token whose trimmed text is its letter, renormalised over the options. Uncalibrated.

Every profile keeps the engine's guarantees: the state is the prefix the prefix cache keeps, user
text is tokenised only as text (never control tokens), every refusal (letters past Z, a prompt past
the context) comes before anything is prefilled, and a yes/no whose labels sit in an order is asked in
both orders, so position cannot bias it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from laya.decide.backend import DecideBackend
from laya.decide.policy import DecideRefused, label_tokens, split_prompt
from laya.decide.prompts import (
    LETTERS,
    MAX_LETTERED,
    LabelStyle,
    Readout,
    check_fits,
    choice_by_letters,
    choice_by_names,
    noul_both_orders,
    prefix_for,
    score_by_digits,
)
from laya.errors import CheckpointError, QuestionError
from laya.questions import NOUL_FALSE_DEFAULT, NOUL_TRUE_DEFAULT, Question, serialize_state

PROFILES = ("first-token", "answer-slot", "json-field", "letters")
LABELS = ("auto", "names", "letters")  # first-token: how a choice's options are labelled (prompts.py)
TOP_TOKENS = 100  # letters: the top tokens read, as slot's harness asks llama-server for (n_probs)

JSON_SYSTEM = ("You are a precise structured-data extraction engine. Read the user's text and decide the value of "
               "every field below. Each field must be set to exactly one of its allowed values. Respond only with a "
               "JSON object containing every field.")


@dataclass(frozen=True)
class Scored:
    """What a prompt's answer is read from: each label's tokens (collision tree), or, for the letters
    readout, each option's letter tokens (every token whose trimmed text is the letter)."""

    labels: list[tuple[int, ...]]
    letters: tuple[tuple[int, ...], ...] | None = None


class Profile:
    """One readout: the prompts of a question over a state, and what is scored."""

    name = ""
    calibrated = False  # its probabilities are the model's own calibration (else only a fitted file makes them so)
    names_questions = False  # its prefix depends on the questions asked (json-field's system turn), not the state only

    def __init__(self, backend: DecideBackend):
        self.backend = backend

    def asks(self, q: Question) -> list[Readout]:
        """The prompts (after the shared prefix) that answer `q`; refusals here, before any prefill."""
        raise NotImplementedError

    def prefix(self, state: Any, questions: list[Question]) -> Any:
        """What a state's questions share (the part the prefix cache keeps)."""
        raise NotImplementedError

    def prefix_tokens(self, prefix: Any) -> tuple[list[int], int]:
        """The prefix alone, and how many of its tokens depend on the questions only (kept across
        states: json-field's system turn), else 0."""
        raise NotImplementedError

    def prompt(self, prefix: Any, alone: list[int], read: Readout) -> tuple[list[int], int]:
        """The whole prompt of one ask and how many of its tokens are the prefix."""
        raise NotImplementedError

    def scored(self, read: Readout) -> Scored:
        return Scored(label_tokens(self.backend, list(read.labels)))

    def isolated(self, q: Question) -> bool:
        """Whether `q`'s prompts are one no/yes row per level (`Evidence.isolated`)."""
        return False


class FirstToken(Profile):
    """Today's readout of chat models (laya.decide.prompts)."""

    name = "first-token"

    def __init__(self, backend: DecideBackend, labels: str = "auto"):
        super().__init__(backend)
        if labels not in LABELS:
            raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")
        self.labels = labels
        space = backend.tokenize(" A")
        self.style = LabelStyle(templated=backend.templated, space_labels=len(space) == 1)

    def _names_usable(self, labels: list[str]) -> bool:
        if self.labels == "letters":
            return False
        try:
            label_tokens(self.backend, [self.style.label(x) for x in labels])
            return True
        except DecideRefused:
            return False

    def asks(self, q: Question) -> list[Readout]:
        if q.qtype == "score":
            return [score_by_digits(q, self.style)]
        if q.qtype == "noul":
            return noul_both_orders(q, self.style, names=self._names_usable(["yes", "no"]))
        names = self._names_usable(list(q.names))
        if not names and self.labels == "names":
            raise QuestionError(f"question {q.qid!r}: its option names share first tokens; "
                                "use distinct first words or the letters readout", qid=q.qid)
        check_fits(q, names_usable=names)
        return [choice_by_names(q, self.style) if names else choice_by_letters(q, self.style)]

    def prefix(self, state: Any, questions: list[Question]) -> str:
        return prefix_for(state)

    def prefix_tokens(self, prefix: str) -> tuple[list[int], int]:
        return self.backend.prompt_tokens(prefix), 0

    def prompt(self, prefix: str, alone: list[int], read: Readout) -> tuple[list[int], int]:
        return split_prompt(self.backend, prefix, read.suffix, alone)


def _check_letters(q: Question, readout: str) -> None:
    if q.n_options > MAX_LETTERED:
        raise QuestionError(f"question {q.qid!r}: the {readout} readout letters its options A to Z, and it has "
                            f"{q.n_options}; ask at most {MAX_LETTERED}", qid=q.qid, error_type="too_many_options")


def _given(q: Question, i: int) -> str | None:
    """Option i's description as the request gave it (a yes/no's default texts count as none)."""
    text = q.descriptions[i]
    if q.qtype == "noul" and text == (NOUL_FALSE_DEFAULT, NOUL_TRUE_DEFAULT)[i]:
        return None
    return text or None


LEVEL_NUMBER = re.compile(r"^\s*-?\d+\s*:\s*")


class AnswerSlot(Profile):
    """dohnuts' decider profile (Mapika/decider's layout): the raw row the model was trained on,
    read at `Answer: (`. No BOS and no chat template; the context `Context:\n<state>` is tokenised on
    its own, then the question: whole up to 10 options, piece by piece past that (`\n(`, the letter's
    own token, `) option`), as decider builds it. A yes/no lists `(A) no`, `(B) yes` (with their
    texts); a score is one yes/no row per level ("Proposed answer: <level>"), a level's probability
    its row's P(yes) over the levels'."""

    name = "answer-slot"
    calibrated = True
    NARROW = 10  # up to this many options the question is tokenised as one string
    ASK = "Which answer fits the context?"
    ISOLATED = "{q}\nProposed answer: {level}\nDoes the proposed answer fit?"

    def _row(self, question: str, options: list[str], keys: tuple[int, ...]) -> Readout:
        head = f"\n\nQuestion: {question}\nOptions:"
        lines = [f"\n({LETTERS[j]}) {text}" for j, text in enumerate(options)]
        suffix = head + "".join(lines) + "\nAnswer: ("
        pieces: tuple[str, ...] = ()
        if len(options) > self.NARROW:
            cut = [head]
            for j, text in enumerate(options):
                cut += ["\n(", LETTERS[j], f") {text}"]
            pieces = (*cut, "\nAnswer: (")
        return Readout(suffix, tuple(LETTERS[: len(options)]), keys, pieces)

    @staticmethod
    def _option(name: str, text: str | None) -> str:
        return name if text is None else f"{name}: {text}"

    def asks(self, q: Question) -> list[Readout]:
        question = q.instructions.strip() or self.ASK
        if q.qtype == "score":
            return [self._row(self.ISOLATED.format(q=question, level=LEVEL_NUMBER.sub("", level or "")), ["no", "yes"],
                              (i,)) for i, level in enumerate(q.descriptions)]
        _check_letters(q, self.name)
        if q.qtype == "noul":
            return [self._row(question, [self._option("no", _given(q, 0)), self._option("yes", _given(q, 1))],
                              (0, 1))]
        return [self._row(question, [self._option(n, d) for n, d in zip(q.names, q.descriptions)],
                          tuple(range(q.n_options)))]

    def isolated(self, q: Question) -> bool:
        return q.qtype == "score"

    def prefix(self, state: Any, questions: list[Question]) -> str:
        return f"Context:\n{decider_state(state)}"

    def prefix_tokens(self, prefix: str) -> tuple[list[int], int]:
        return self.backend.tokenize(prefix), 0

    def prompt(self, prefix: Any, alone: list[int], read: Readout) -> tuple[list[int], int]:
        tokens = list(alone)
        for piece in read.pieces or (read.suffix,):
            tokens += self.backend.tokenize(piece)
        return tokens, len(alone)


def decider_state(state: Any) -> str:
    """The state as decider writes it: text as it is, anything else JSON, the items of a list of 8 or
    more objects numbered (`_index`) so the model can point at one."""

    def annotate(value: Any) -> Any:
        if isinstance(value, list):
            items = [annotate(v) for v in value]
            if len(items) >= 8 and all(isinstance(v, dict) for v in items):
                return [{"_index": i, **v} for i, v in enumerate(items)]
            return items
        if isinstance(value, dict):
            return {k: annotate(v) for k, v in value.items()}
        return value

    return state if isinstance(state, str) else json.dumps(annotate(state), ensure_ascii=False)


class Letters(Profile):
    """slot's Hmm readout (n4ze3m/hmm's training layout): one chat turn with reasoning off, the
    option letter read from the top tokens."""

    name = "letters"

    def __init__(self, backend: DecideBackend):
        super().__init__(backend)
        if not backend.templated:
            raise CheckpointError("the letters readout asks in a chat turn, and this model has no chat template; "
                                  "use answer-slot or first-token")
        self._letter_ids: dict[str, tuple[int, ...]] | None = None

    @staticmethod
    def _entries(q: Question) -> list[tuple[str, str | None]]:
        """(key, description) per option: a yes/no's are "false" and "true" (described "No" and "Yes"
        when the request does not), a score's its level numbers."""
        if q.qtype == "noul":
            return [("false", _given(q, 0) or "No"), ("true", _given(q, 1) or "Yes")]
        return list(zip(q.keys, q.descriptions))

    def asks(self, q: Question) -> list[Readout]:
        _check_letters(q, self.name)
        lines = [f"{LETTERS[i]}: {key}" + (f" — {text}" if text else "")
                 for i, (key, text) in enumerate(self._entries(q))]
        suffix = (f"Question:\n{q.instructions.strip()}\n\nOptions:\n" + "\n".join(lines)
                  + "\nReturn only the option letter.")
        return [Readout(suffix, tuple(LETTERS[: q.n_options]), tuple(range(q.n_options)))]

    def prefix(self, state: Any, questions: list[Question]) -> str:
        text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        return f"State (data to evaluate):\n{text}\n\n"

    def prefix_tokens(self, prefix: str) -> tuple[list[int], int]:
        return self.backend.prompt_tokens(prefix), 0

    def prompt(self, prefix: str, alone: list[int], read: Readout) -> tuple[list[int], int]:
        return split_prompt(self.backend, prefix, read.suffix, alone)

    def letter_ids(self) -> dict[str, tuple[int, ...]]:
        """Every token whose trimmed text is one capital letter, by letter (read once per model)."""
        if self._letter_ids is None:
            found: dict[str, list[int]] = {letter: [] for letter in LETTERS}
            for token, text in enumerate(self.backend.token_texts()):
                trimmed = text.strip()
                if trimmed in found:
                    found[trimmed].append(token)
            self._letter_ids = {letter: tuple(ids) for letter, ids in found.items()}
        return self._letter_ids

    def scored(self, read: Readout) -> Scored:
        ids = self.letter_ids()
        letters = tuple(ids[x] for x in read.labels)
        for letter, tokens in zip(read.labels, letters):
            if not tokens:
                raise QuestionError(f"the model has no token that reads as the letter {letter!r}",
                                    error_type="invalid_readout")
        return Scored([], letters)


class JsonField(Profile):
    """pcdServer's readout: the first tokens of the allowed values inside a JSON object, under the
    model's chat template with a fixed system turn. Each field is read straight after the object's
    `{\n` (not after the fields before it), its member prefix `  "name": "` carrying what all its
    values share; a boolean ends at the colon, its candidates ` false` and ` true`. pcdServer has no
    number fields: a score's levels are the strings "0", "1", ... A raw softmax: uncalibrated."""

    name = "json-field"
    names_questions = True
    OPENING = "{\n"  # what the assistant turn starts with, tokenised with the template's markup

    def __init__(self, backend: DecideBackend):
        super().__init__(backend)
        if not backend.templated:
            raise CheckpointError("the json-field readout asks under a chat template with a system turn, and this "
                                  "model has no chat template; use answer-slot or first-token")
        backend.chat_tokens("", "", self.OPENING)  # a template that takes no system turn is refused at load

    @staticmethod
    def _values(q: Question) -> list[str]:
        """Each allowed value as its JSON text."""
        if q.qtype == "noul":
            return ["false", "true"]
        return [json.dumps(v, ensure_ascii=False) for v in (q.keys if q.qtype == "score" else q.names)]

    @classmethod
    def field_line(cls, q: Question) -> str:
        about = q.instructions.strip()
        return (f"- {json.dumps(q.qid, ensure_ascii=False)}" + (f": {about}" if about else "")
                + ". Allowed values: " + ", ".join(cls._values(q)))

    @classmethod
    def system(cls, questions: list[Question]) -> str:
        members = [f"  {json.dumps(q.qid, ensure_ascii=False)}: <value>" for q in questions]
        return (f"{JSON_SYSTEM}\n\nFields:\n" + "\n".join(cls.field_line(q) for q in questions)
                + "\n\nOutput format:\n{\n" + ",\n".join(members) + "\n}")

    def asks(self, q: Question) -> list[Readout]:
        key = json.dumps(q.qid, ensure_ascii=False)
        if q.qtype == "noul":
            return [Readout(f"  {key}:", (" false", " true"), (0, 1))]
        # each value as the model would write it, to its closing quote, after what all of them share
        # (a value that begins another, "kern" and "kern pair", then parts from it at a token)
        tails = [v[1:] for v in self._values(q)]
        shared = os.path.commonprefix(tails)
        return [Readout(f'  {key}: "{shared}', tuple(t[len(shared):] for t in tails), tuple(range(q.n_options)))]

    def prefix(self, state: Any, questions: list[Question]) -> tuple[str, str]:
        return self.system(questions), serialize_state(state)

    def prefix_tokens(self, prefix: tuple[str, str]) -> tuple[list[int], int]:
        system, user = prefix
        return self.backend.chat_tokens(system, user, self.OPENING)

    def prompt(self, prefix: Any, alone: list[int], read: Readout) -> tuple[list[int], int]:
        return alone + self.backend.tokenize(read.suffix), len(alone)


def make_profile(name: str, backend: DecideBackend, labels: str = "auto") -> Profile:
    """The profile called `name` over `backend` (a model it cannot read raises `CheckpointError`)."""
    if name == "first-token":
        return FirstToken(backend, labels)
    if name == "answer-slot":
        return AnswerSlot(backend)
    if name == "json-field":
        return JsonField(backend)
    if name == "letters":
        return Letters(backend)
    raise ValueError(f"readout must be one of {', '.join(PROFILES)}, got {name!r}")
