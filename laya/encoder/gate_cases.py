"""The decision requests the precision gate reads: every kind of input a caller sends, at every length.

A gate measured on rows that do not look like what callers send under-states the drift it promises to
bound: rounding in a reduced precision moves an answer most where the attention it feeds is sharp,
which depends on the text (scripts the vocabulary splits into many pieces, the special tokens a
caller may type, a state cut at the row's end, a question half filled with option markers). So the
gate's requests are built from the kinds below, each at several lengths up to the checkpoint's row,
deterministically (the same checkpoint always gets the same rows, so a cached record stays valid).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laya.encoder.tokenizer import Tokenizer

# the kinds of input the gate covers (tests/test_gate_cases.py holds every one present)
KINDS = ("text", "json_object", "conversation", "non_latin", "cut_at_max_len", "many_options", "labels_only",
         "special_tokens", "score", "noul", "several_questions")

WORDS = ("refund", "invoice", "order", "late", "angry", "happy", "billing", "shipping", "login", "password",
         "cancel", "upgrade", "thanks", "broken", "urgent", "price", "account", "delivery", "warranty", "the",
         "customer", "was", "charged", "twice", "please", "help", "app", "crashes", "since", "update")
SCRIPTS = (
    "שלום, חויבתי פעמיים על המנוי החודש. אנא החזירו את התשלום הנוסף בהקדם.",
    "مرحبا، تم خصم المبلغ مرتين من حسابي هذا الشهر. أرجو إعادة المبلغ الزائد.",
    "你好，我这个月的订阅被扣了两次费用，请尽快退还多收的款项。应用自更新后一直崩溃。",
    "こんにちは。今月のサブスクリプションが二重に請求されました。返金をお願いします。",
    "Здравствуйте, с меня дважды списали оплату за подписку в этом месяце. Верните лишний платёж.",
    "नमस्ते, इस महीने मेरी सदस्यता के लिए दो बार शुल्क लिया गया। कृपया अतिरिक्त भुगतान वापस करें।",
    "안녕하세요, 이번 달 구독료가 두 번 청구되었습니다. 추가 결제 금액을 환불해 주세요.",
    "Γεια σας, χρεώθηκα δύο φορές για τη συνδρομή μου αυτόν τον μήνα. Παρακαλώ επιστρέψτε το ποσό.",
    "สวัสดีครับ ฉันถูกเรียกเก็บเงินสองครั้งสำหรับการสมัครสมาชิกเดือนนี้ กรุณาคืนเงินส่วนเกิน",
    "Hi 👋 charged twice 💳💳 this month — please refund ✅ (ça ne marche plus, Straße, naïve café)",
)


@dataclass(frozen=True)
class Case:
    """One request of the gate: its kind, its state and its questions (the API's shapes)."""

    kind: str
    state: Any
    questions: dict[str, Any]


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _choice(rng: random.Random, n: int, described: bool = True, prefix: str = "") -> dict[str, Any]:
    labels = [f"{prefix}{rng.choice(WORDS)}_{i}" for i in range(n)]
    criteria: Any = ({label: _text(rng, rng.randint(1, 8)) for label in labels} if described else labels)
    return {"type": "choice", "instructions": f"Which one fits? {_text(rng, rng.randint(3, 12))}",
            "criteria": criteria}


def _score(rng: random.Random, levels: int) -> dict[str, Any]:
    return {"type": "score", "instructions": f"How much: {_text(rng, 4)}",
            "criteria": [_text(rng, rng.randint(1, 5)) for _ in range(levels)]}


def _noul(rng: random.Random, sided: str = "both") -> dict[str, Any]:
    question: dict[str, Any] = {"type": "noul", "instructions": f"Is it true that {_text(rng, 6)}?"}
    if sided == "both":
        question["criteria"] = {"true": _text(rng, 4), "false": _text(rng, 4)}
    elif sided == "true":
        question["criteria"] = {"true": _text(rng, 5)}
        question["labels"] = {"false": "nope", "true": "yes indeed"}
    return question


def _mixed(rng: random.Random, i: int) -> dict[str, Any]:
    """One choice, one score and one yes/no, of sizes that vary with `i`."""
    return {"c": _choice(rng, 2 + i % 11, described=i % 3 != 0), "s": _score(rng, 2 + i % 9),
            "n": _noul(rng, ("both", "true", "none")[i % 3])}


def cases(tok: Tokenizer, max_len: int, fits: Callable[[Any, dict[str, Any]], bool]) -> list[Case]:
    """The gate's requests for a checkpoint with this tokenizer and row (`fits(state, questions)`: every
    option marker of every question fits in the row), from short states to states cut at the row."""
    rng = random.Random(1234)
    tokens_per_word = max(1, len(tok.encode(_text(random.Random(0), 64))) // 64)
    row_words = max(8, max_len // tokens_per_word)
    lengths = [3, row_words // 8, row_words]
    out: list[Case] = []
    for i, n_words in enumerate(lengths):
        out.append(Case("text", _text(rng, n_words), _mixed(rng, i)))
    out.append(Case("cut_at_max_len", _text(rng, 2 * row_words), _mixed(rng, 5)))
    out.append(Case("cut_at_max_len", _text(rng, row_words + 7), {"c": _choice(rng, 4)}))
    obj = {"customer": {"name": "Dana Levi", "tier": "gold", "id": 48213},
           "messages": [_text(rng, 20) for _ in range(3)], "amounts": [12.5, 12.5, -3], "flagged": True,
           "note": SCRIPTS[0], "nested": {"a": {"b": [1, {"c": None}]}}}
    out.append(Case("json_object", obj, _mixed(rng, 6)))
    out.append(Case("json_object", {"log": [_text(rng, 30) for _ in range(row_words // 60 + 1)]}, _mixed(rng, 7)))
    conversation = [{"role": ("user", "assistant")[k % 2], "content": _text(rng, rng.randint(5, 60))}
                    for k in range(row_words // 20 + 3)]
    out.append(Case("conversation", conversation, _mixed(rng, 8)))
    out.append(Case("conversation", [{"role": "user", "content": SCRIPTS[2]}], {"n": _noul(rng)}))
    for k, text in enumerate(SCRIPTS):
        state = " ".join([text] * (1 + k * max(1, row_words // 200)))  # a few lines up to half a row
        questions = ({"c": _choice(rng, 3 + k % 5), "n": _noul(rng)} if k % 2 else
                     {"c": {"type": "choice", "instructions": SCRIPTS[(k + 1) % len(SCRIPTS)],
                            "criteria": {"חיוב": SCRIPTS[k][:20], "支持": None, "Продажи": SCRIPTS[-1][:30]}}})
        out.append(Case("non_latin", state, questions))
    out += _many_options(rng, row_words, fits)
    out.append(Case("labels_only", _text(rng, row_words // 4),
                    {"c": _choice(rng, 6, described=False),
                     "m": {"type": "choice", "instructions": "Pick", "criteria": {"a": None, "b": "", "c": None}}}))
    specials = " ".join(dict.fromkeys([tok.mask_token, tok.cls_token, tok.sep_token, tok.pad_token]))
    out.append(Case("special_tokens", f"{_text(rng, 20)} {specials} {_text(rng, 40)} {tok.mask_token}",
                    {"c": {"type": "choice", "instructions": f"Which {tok.mask_token} fits {tok.sep_token}?",
                           "criteria": {f"opt{tok.mask_token}": f"a {tok.cls_token} b", "plain": specials,
                                        tok.sep_token: None}},
                     "n": _noul(rng)}))
    out.append(Case("score", _text(rng, row_words // 4), {f"s{n}": _score(rng, n) for n in (2, 5, 10)}))
    out.append(Case("noul", _text(rng, row_words // 3),
                    {"a": _noul(rng, "both"), "b": _noul(rng, "true"), "c": _noul(rng, "none")}))
    several = {f"q{k}": (_choice(rng, 2 + 3 * k) if k % 3 == 0 else _score(rng, 3 + k % 7) if k % 3 == 1
                         else _noul(rng)) for k in range(6)}
    out.append(Case("several_questions", json.dumps({"ticket": _text(rng, row_words // 4)}), several))
    return out


def _many_options(rng: random.Random, row_words: int, fits: Callable[[Any, dict[str, Any]], bool]) -> list[Case]:
    """Choices from 16 options (a tournament's group) up to as many as the row holds (255 at most), with
    and without descriptions."""
    state = _text(rng, row_words)
    found = []
    for described in (True, False):
        low, high = 16, 255  # the most options whose markers fit, by bisection
        while low < high:
            mid = (low + high + 1) // 2
            if fits(state, {"c": _choice(random.Random(mid), mid, described)}):
                low = mid
            else:
                high = mid - 1
        for n in ((16,) if described else (low,)):  # a tournament's group, described; the most the row holds
            question = _choice(rng, n, described)
            if fits(state, {"c": question}):
                found.append(Case("many_options", state, {"c": question}))
    return found
