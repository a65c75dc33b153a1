"""The wide-budget golden cases: questions whose heads crowd a 1,024 / 256-token row budget.

Plain code over a tokenizer (some cases are fitted to it: an option of exactly 48 tokens, a last
marker at exactly position 1,023), imported by `make_wide_golden.py`, which runs upstream on them,
and by `tests/test_tournament.py`, which rebuilds them from the generated checkpoint's tokenizer and
checks each against the digest of the input upstream answered (`input_digest`).
"""

from __future__ import annotations

import hashlib
import json

LONG = "a description long enough that two hundred and fifty five of these never fit in one row"
TEXT = ("The customer was charged twice for the same order and wants a refund today. "
        "The parcel left the warehouse on Monday and never arrived. ")
CONVERSATION = [{"role": "user", "content": "hello, my parcel is late"},
                {"role": "assistant", "content": "Let me check."},
                {"role": "user", "content": TEXT * 12},
                {"role": "user", "content": "Cancel it and refund me, I am furious!"}]


def input_digest(case: dict) -> str:
    text = json.dumps([case["state"], case["questions"]], ensure_ascii=False, sort_keys=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def option_len(tok, text: str) -> int:
    return 1 + min(48, len(tok.encode(" " + text)))  # its [MASK] and its (capped) tokens


def labels_of_length(tok, length: int, count: int, stem: str, at_least: bool = False) -> list[str]:
    """`count` distinct labels whose option (the [MASK] included) is exactly `length` tokens (or at
    least `length`)."""
    out: list[str] = []
    for i in range(20000):
        for text in (f"{stem}{i}", f"{stem} {i}", f"{stem}{i} x", f"{stem} {i} {i}"):
            n = option_len(tok, text)
            if text not in out and (n >= length if at_least else n == length):
                out.append(text)
                break
        if len(out) == count:
            return out
    raise RuntimeError(f"not enough labels of {length} tokens")


def text_of_length(tok, length: int, label: str) -> str:
    """`label: xxx...` whose option is exactly `length` tokens (the [MASK] included)."""
    for k in range(200):
        text = f"{label}: " + "x" * k
        if option_len(tok, text) == length:
            return text
    raise RuntimeError(f"no option of {length} tokens for {label!r}")


def last_marker_at(tok, n: int, instructions: str, target: int) -> list[str]:
    """`n` bare labels whose last [MASK] lands at position `target` under the per-option cap of 4
    (the head crowded far past `head_max_len`: the instructions keep their floor of 8 tokens)."""
    q = min(8, len(tok.encode(f"choice question: {instructions}")))
    before = target - (2 + q)  # tokens of the first n-1 options
    short = 4 * (n - 1) - before  # that many of them take 3 tokens instead of 4
    assert 0 <= short < n - 1, (n, target, short)
    labels = labels_of_length(tok, 3, short, "s") + labels_of_length(tok, 4, n - short, "team", at_least=True)
    return labels[: n - 1] + labels[-1:]


def choice(criteria, instructions: str = "Which label fits?") -> dict:
    return {"type": "choice", "instructions": instructions, "criteria": criteria}


def described(n: int, stem: str = "label") -> dict:
    return {f"{stem} {i}": f"{LONG} {i}" for i in range(n)}


def wide_cases(tok) -> list[dict]:
    """`tok`: the wide checkpoint's tokenizer (laya's `Tokenizer`: `encode`, `mask_token`)."""
    mask = tok.mask_token
    urgent = {"type": "noul", "instructions": "Is this urgent?"}
    levels = {"type": "score", "instructions": "How angry?", "criteria": [f"level {i}: {LONG}" for i in range(10)]}
    # options of 49 + 49 + 49 + 49 + 44 = 240 tokens leave exactly 16 for the instructions: no cap (with
    # one, the 49s would be cut to 48); one token more (45) leaves 15: the cap of 48 applies
    full = [text_of_length(tok, 49, f"o{i}") for i in range(4)]
    at_16 = dict.fromkeys([*full, text_of_length(tok, 44, "o4")])
    at_15 = dict.fromkeys([*full, text_of_length(tok, 45, "o4")])
    c: list[dict] = []

    def add(name: str, state, questions: dict) -> None:
        c.append({"id": name, "state": state, "questions": questions})

    add("c4-long-options", TEXT * 20, {"q": choice(described(4))})
    add("c5-left-16", TEXT * 20, {"q": choice(at_16, instructions=TEXT)})
    add("c5-left-15", TEXT * 20, {"q": choice(at_15, instructions=TEXT)})
    add("c6-capped", CONVERSATION, {"q": choice(described(6)), "u": urgent})
    add("c60-conversation", CONVERSATION, {"q": choice(described(60)), "a": levels})
    add("c120-object", {"message": TEXT * 8, "plan": "pro"}, {"q": choice(described(120), instructions=TEXT * 3)})
    add("c200-bare", TEXT * 20, {"q": choice([f"team {i}" for i in range(200)])})
    add("c240", TEXT * 20, {"q": choice(described(240))})
    add("c252-four-state-tokens", TEXT * 20, {"q": choice(described(252))})
    add("c253-row-exactly-full", TEXT * 20, {"q": choice(described(253))})
    add("c254-head-past-the-row", TEXT * 20, {"q": choice(described(254)), "u": urgent, "a": levels})
    add("c254-conversation", CONVERSATION, {"q": choice(described(254, "team"), instructions="x"), "u": urgent})
    add("c254-mask-literal", f"a {mask} in the state {mask}",
        {"q": choice({f"label {i}{mask}": f"{mask}{LONG} {i}" for i in range(254)}, instructions=f"Which {mask}?")})
    add("c254-distinct", TEXT * 20, {"q": choice([f"s{i} x" for i in range(254)], instructions="x")})
    add("c255-last-marker-1023", "short state", {"q": choice(last_marker_at(tok, 255, "x", 1023), instructions="x")})
    add("c255-last-marker-1024", "short state", {"q": choice(last_marker_at(tok, 255, "x", 1024), instructions="x")})
    add("score-noul-long-state", TEXT * 40, {"a": levels, "u": urgent})
    return c
