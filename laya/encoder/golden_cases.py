"""The golden cases: varied requests that pin our answers to upstream laya's.

Plain data with no import of laya's: the golden maker (tests/golden/make_golden.py) runs them through
upstream and records `tests/golden/answers.json`, which the parity tests replay; the precision gate
(`laya.encoder.gate`) reports a reduced precision's drift on them, as inputs its own rows never were.
"""

from __future__ import annotations

LONG_TEXT = (
    "The customer was charged twice for the same order and wants a refund today. "
    "The shipment left the warehouse on Monday and should arrive within three working days. "
    "Our new pricing plan starts at twelve dollars per month for small teams. "
)
CONVERSATION = [
    {"role": "user", "content": "hi, I have a problem with my invoice"},
    {"role": "assistant", "content": "How can I help?"},
    {"role": "user", "content": LONG_TEXT * 3},
    {"role": "assistant", "content": "Let me check the order for you."},
    {"role": "user", "content": "Actually, just cancel the subscription. I am furious!"},
]
TEAMS = {"billing": "payments, invoices and refunds", "sales": "new plans and pricing",
         "support": "technical problems", "security": None, "legal": ""}
ROUTE = {"type": "choice", "instructions": "Which team should handle this message?", "criteria": TEAMS}
ANGER = {"type": "score", "instructions": "How angry is the user?", "criteria": ["calm", "annoyed", "furious"]}
URGENT = {"type": "noul", "instructions": "Is this message urgent?"}


def _labels(n: int, stem: str = "option") -> dict:
    return {f"{stem} {i}": f"the description of {stem} number {i}" for i in range(n)}


def cases(mask: str, sep: str) -> list[dict]:
    """`mask`/`sep` are the checkpoint's literal special-token strings (planted in texts on purpose)."""
    c: list[dict] = []

    def add(name: str, state, questions: dict) -> None:
        c.append({"id": name, "state": state, "questions": questions})

    add("choice-map", "I was charged twice and want my money back.", {"team": ROUTE})
    add("choice-list", "Please open the settings page.",
        {"next": {"type": "choice", "instructions": "Pick the next action", "criteria": ["open settings", "go back",
                                                                                         "search", "ask a human"]}})
    add("choice-two", "The weather is sunny.", {"q": {"type": "choice", "instructions": "Sentiment?",
                                                      "criteria": {"positive": None, "negative": None}}})
    add("choice-seven", LONG_TEXT, {"q": {"type": "choice", "instructions": "Topic?", "criteria": _labels(7)}})
    add("choice-twelve", LONG_TEXT, {"q": {"type": "choice", "instructions": "Topic?", "criteria": _labels(12)}})
    add("choice-thirty", LONG_TEXT, {"q": {"type": "choice", "instructions": "Topic?", "criteria": _labels(30)}})
    add("choice-sixty", "short state", {"q": {"type": "choice", "instructions": "Pick one of the many options",
                                              "criteria": _labels(60, "item")}})
    add("choice-too-many", "short state", {"q": {"type": "choice", "instructions": "Pick one",
                                                 "criteria": _labels(70, "item")}})
    add("choice-long-options", "refund please",
        {"q": {"type": "choice", "instructions": "Which policy applies?",
               "criteria": {"a": LONG_TEXT, "b": LONG_TEXT[::-1], "c": "short"}}})
    add("choice-structured-description", "My card was declined.",
        {"q": {"type": "choice", "instructions": "Route",
               "criteria": {"billing": {"handles": ["cards", "refunds"], "priority": 2}, "other": ["x", 1, None]}}})
    add("choice-non-ascii", "고객이 환불을 요청했습니다.",
        {"q": {"type": "choice", "instructions": "Welche Abteilung?",
               "criteria": {"결제": "환불과 결제", "Verkauf": "Preise und Pläne", "🚀 support": "technische Hilfe"}}})
    add("choice-mask-literal", f"state with a {mask} inside",
        {"q": {"type": "choice", "instructions": f"Which {mask} fits?",
               "criteria": {f"{mask}a": f"first {mask}", "b": "second"}}})
    add("choice-numeric-labels", "rate it", {"q": {"type": "choice", "instructions": "Pick a number",
                                                   "criteria": [1, 2, 3]}})
    add("choice-shared-prefix", "short", {"q": {"type": "choice", "instructions": "x" * 20,
                                                "criteria": {f"{LONG_TEXT[:60]} {i}": None for i in range(40)}}})
    add("score-three", "I am a bit annoyed by the delay.", {"anger": ANGER})
    add("score-two", "ok", {"q": {"type": "score", "instructions": "Quality?", "criteria": ["bad", "good"]}})
    add("score-five-structured", "The service was fine.",
        {"q": {"type": "score", "instructions": "Satisfaction",
               "criteria": [{"label": "awful"}, ["meh", 1], "okay", 3.5, "great"]}})
    add("score-ten", LONG_TEXT, {"q": {"type": "score", "instructions": "Urgency from 0 to 9",
                                       "criteria": [f"urgency {i}" for i in range(10)]}})
    add("score-long-levels", "text", {"q": {"type": "score", "instructions": "Level?",
                                            "criteria": [LONG_TEXT, "medium", LONG_TEXT[:80]]}})
    add("noul-bare", "The invoice was paid.", {"q": URGENT})
    add("noul-true-only", "The invoice was paid.",
        {"q": {"type": "noul", "instructions": "Paid?", "criteria": {"true": "the invoice is paid"}}})
    add("noul-false-only", "The invoice was paid.",
        {"q": {"type": "noul", "instructions": "Paid?", "criteria": {"false": "nothing was paid"}}})
    add("noul-two-sided", "The invoice was paid.",
        {"q": {"type": "noul", "instructions": "Paid?", "criteria": {"true": "paid", "false": "unpaid"}}})
    add("noul-cased-keys", "The invoice was paid.",
        {"q": {"type": "noul", "instructions": "Paid?", "criteria": {"True": "paid", "FALSE": "not paid"}}})
    add("noul-labels", "The invoice was paid.",
        {"q": {"type": "noul", "instructions": "Paid?", "labels": {"false": "B", "true": "A"}}})
    add("noul-structured", "text", {"q": {"type": "noul", "instructions": "Holds?",
                                          "criteria": {"true": {"when": "always"}, "false": ["never"]}}})
    add("instructions-dict", "Refund please",
        {"q": {"type": "choice", "instructions": {"task": "route", "hint": "Zahlung → billing"},
               "criteria": TEAMS}})
    add("instructions-list", "Refund please",
        {"q": {"type": "noul", "instructions": ["is it", "about money?", 3]}})
    add("instructions-number", "Refund please", {"q": {"type": "noul", "instructions": 42}})
    add("instructions-long", "short state",
        {"q": {"type": "choice", "instructions": LONG_TEXT * 4, "criteria": _labels(5)}})
    add("state-dict", {"user": "alice", "message": "refund please", "order": {"id": 12345, "items": ["book"]}},
        {"team": ROUTE, "urgent": URGENT})
    add("state-conversation", CONVERSATION, {"team": ROUTE, "anger": ANGER})
    add("state-long-text", LONG_TEXT * 6, {"team": ROUTE, "anger": ANGER, "urgent": URGENT})
    add("state-mask-literal", f"{mask} {mask}{mask} hidden masks {mask}", {"urgent": URGENT})
    add("state-special-literal", f"first part {sep} second part", {"urgent": URGENT})
    add("state-non-ascii", "Der Kunde möchte sein Geld zurück. 客户要求退款。 Клиент хочет вернуть деньги. 🙂",
        {"team": ROUTE})
    add("state-empty", "", {"urgent": URGENT, "anger": ANGER})
    add("state-newlines-emoji", "line one\n\nline two\t✅\r\n❌ end", {"anger": ANGER})
    add("state-list-of-strings", ["first turn", "second turn", "newest turn " + LONG_TEXT * 5], {"urgent": URGENT})
    add("many-questions", CONVERSATION, {
        "team": ROUTE, "anger": ANGER, "urgent": URGENT,
        "lang": {"type": "choice", "instructions": "Language?", "criteria": ["English", "German", "Korean"]},
        "paid": {"type": "noul", "instructions": "Was it paid?", "criteria": {"true": "paid"}},
        "size": {"type": "score", "instructions": "Order size", "criteria": ["small", "medium", "large", "huge"]},
        "next": {"type": "choice", "instructions": "Next step", "criteria": _labels(11, "step")},
        "ok": {"type": "noul", "instructions": "All good?"},
    })
    add("question-ids-unusual", "refund", {"a b.c": URGENT, "한국어 🙂": ANGER, "x": ROUTE})
    add("long-everything", LONG_TEXT * 10,
        {"q": {"type": "choice", "instructions": LONG_TEXT * 2,
               "criteria": {f"{i}": LONG_TEXT for i in range(6)}}})
    add("empty-descriptions", "meh", {"q": {"type": "choice", "instructions": "Pick",
                                            "criteria": {"a": None, "b": "", "c": 0, "d": False}}})
    return c
