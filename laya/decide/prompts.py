"""System One questions as decide prompts.

The state is the prefix (prefilled once per request, kept for the next), each question a suffix.
Two readouts for a choice:

- `names`: the options are listed by name and each is scored by its name's tokens (the allowed values
  themselves): by the first token where that tells them apart, and level by level through a
  collision tree where names share beginnings (`policy.collision_tree`). Used unless two names are
  the very same tokens.
- `letters`: lettered options `A) name: description`, scored by single-token letters (at most 26).

Small chat models read letters by position more than by meaning: on SmolLM2-135M the letter
readout of a billing question gave 0.32 / 0.35 / 0.33 averaged over all six option orders (no
signal), the name readout 0.70 to 0.93 for billing in every order. So `auto` prefers names.
Score levels are digits (at most 10). A yes/no is asked in both orders and the readings averaged, so
the position of "yes" cannot bias the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from laya.errors import QuestionError
from laya.questions import Question, serialize_state

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_LETTERED = len(LETTERS)


@dataclass(frozen=True)
class Readout:
    """One prompt suffix and its labels; `keys[i]` is the answer index label i stands for. `pieces`,
    when given, are the suffix cut where it is tokenised piece by piece (their concatenation is
    `suffix`), as a raw layout that puts single letter tokens between its texts does."""

    suffix: str
    labels: tuple[str, ...]
    keys: tuple[int, ...]
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelStyle:
    """How labels follow the prompt: after a chat template's assistant opener, or a raw `Answer:`."""

    templated: bool
    space_labels: bool = True  # raw prompts: the tokenizer has single " A"-style tokens

    def closing(self, text: str) -> str:
        if self.templated:
            return text
        return text + ("\nAnswer:" if self.space_labels else "\nAnswer: ")

    def label(self, text: str) -> str:
        return " " + text if not self.templated and self.space_labels else text


def prefix_for(state: object) -> str:
    return f"Read the text below, then answer the question that follows it.\n\nText:\n{serialize_state(state)}\n\n"


def check_fits(question: Question, names_usable: bool = False) -> None:
    if question.qtype == "choice" and question.n_options > MAX_LETTERED and not names_usable:
        raise QuestionError(
            f"question {question.qid!r}: two of its {question.n_options} option names are the same tokens, so "
            f"they cannot be told apart, and the lettered readout holds at most {MAX_LETTERED}; make the names "
            "differ", qid=question.qid, error_type="identical_options")


def choice_by_names(question: Question, style: LabelStyle) -> Readout:
    lines = [f"- {text}" for text in question.options]
    ask = question.instructions.strip() or "Which option fits the text best?"
    suffix = (f"Question: {ask}\nOptions:\n" + "\n".join(lines) + "\n"
              + style.closing("Answer with the name of the best option only."))
    return Readout(suffix, tuple(style.label(n) for n in question.names), tuple(range(question.n_options)))


def choice_by_letters(question: Question, style: LabelStyle) -> Readout:
    letters = LETTERS[: question.n_options]
    lines = [f"{letter}) {text}" for letter, text in zip(letters, question.options)]
    ask = question.instructions.strip() or "Which option fits the text best?"
    suffix = (f"Question: {ask}\nOptions:\n" + "\n".join(lines) + "\n"
              + style.closing("Answer with the letter of the best option only."))
    return Readout(suffix, tuple(style.label(x) for x in letters), tuple(range(question.n_options)))


def score_by_digits(question: Question, style: LabelStyle) -> Readout:
    lines = [f"{i}) {text}" for i, text in enumerate(question.descriptions)]
    ask = question.instructions.strip() or "Which level fits the text best?"
    suffix = (f"Question: {ask}\nLevels:\n" + "\n".join(lines) + "\n"
              + style.closing("Answer with the number of the level only."))
    return Readout(suffix, tuple(style.label(str(i)) for i in range(question.n_options)),
                   tuple(range(question.n_options)))


def noul_both_orders(question: Question, style: LabelStyle, names: bool) -> list[Readout]:
    false_text, true_text = question.descriptions
    ask = question.instructions.strip() or "Does the statement hold for the text?"
    out = []
    for order in ((1, 0), (0, 1)):  # true first, then false first
        if names:
            texts = {0: ("no", false_text), 1: ("yes", true_text)}
            lines = [f"- {texts[k][0]}: {texts[k][1]}" for k in order]
            closing, labels = "Answer yes or no only.", tuple(texts[k][0] for k in order)
        else:
            lettered = {0: f"false: {false_text}", 1: f"true: {true_text}"}
            lines = [f"{LETTERS[i]}) {lettered[k]}" for i, k in enumerate(order)]
            closing, labels = "Answer with the letter of the right option only.", ("A", "B")
        suffix = f"Question: {ask}\nOptions:\n" + "\n".join(lines) + "\n" + style.closing(closing)
        out.append(Readout(suffix, tuple(style.label(x) for x in labels), order))
    return out
