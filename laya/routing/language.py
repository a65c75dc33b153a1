"""What script a state is written in and, for Latin script, whether it is English.

The router needs one bit per state: can the English checkpoint read it? That checkpoint has no
tokens for most non-Latin scripts and, off English, stays confident while it is wrong, so the
safe direction is always "multilingual". The rules here reproduce the decisions upstream laya
0.4.15 makes (its reasons are reported on every answer, so the two must agree): script by Unicode
block, then for Latin text function-word counts per language, non-English letters, and a
line-by-line and field-by-field look for a foreign part hidden inside an English state.

Everything is plain Python on at most a few thousand characters per read, so routing costs
microseconds and a huge state costs no more than a small one.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from laya.routing.words import (
    ENGLISH_COLLISIONS,
    FUNCTION_WORDS,
    NON_ENGLISH_LETTERS,
    NORDIC_SHARED,
    SWEDISH_SHORT,
)

WINDOW = 4000  # characters read per pass: the whole-state window, the segment scan, one line
DIACRITIC_FLOOR = 0.02  # share of non-English letters that is itself evidence of another language
RESCUE_CEILING = 0.06  # above this share, English function words no longer outvote the letters
# A Latin-plurality text is still non-Latin when these carry it (a product code outvotes a CJK
# request letter for letter, though one ideograph says far more than one Latin letter).
NON_LATIN_SHARE = 0.2
NON_LATIN_LONG_SHARE = 0.1
NON_LATIN_LETTERS = 10
MIN_WORDS = 4  # fewer words than this name no language
SHOUT_WORD = 5  # an all-caps run this long is a word, shorter ones may be acronyms
SHOUT_STOPWORD = 4  # an all-caps line is believed only on a matched function word this long
MAX_DEPTH = 6  # nesting below this is not read
# Characters the field-by-field read covers, over all fields together. Upstream reads every line of
# every field; this bound is far above any message (a quarter of a million characters), so the two
# agree on real states, while a state of a million fields costs no more than one of a few hundred.
FIELD_BUDGET = 1 << 18

# Unicode blocks by script. A letter outside every block is counted as "other": still non-Latin.
_BLOCKS: dict[str, tuple[tuple[int, int], ...]] = {
    "greek": ((0x0370, 0x03FF), (0x1F00, 0x1FFF)),
    "cyrillic": ((0x0400, 0x052F), (0x2DE0, 0x2DFF), (0xA640, 0xA69F)),
    "armenian": ((0x0530, 0x058F),),
    "hebrew": ((0x0590, 0x05FF),),
    "arabic": ((0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "devanagari": ((0x0900, 0x097F), (0xA8E0, 0xA8FF)),
    "bengali": ((0x0980, 0x09FF),),
    "gurmukhi": ((0x0A00, 0x0A7F),),
    "gujarati": ((0x0A80, 0x0AFF),),
    "oriya": ((0x0B00, 0x0B7F),),
    "tamil": ((0x0B80, 0x0BFF),),
    "telugu": ((0x0C00, 0x0C7F),),
    "kannada": ((0x0C80, 0x0CFF),),
    "malayalam": ((0x0D00, 0x0D7F),),
    "sinhala": ((0x0D80, 0x0DFF),),
    "thai": ((0x0E00, 0x0E7F),),
    "lao": ((0x0E80, 0x0EFF),),
    "tibetan": ((0x0F00, 0x0FFF),),
    "myanmar": ((0x1000, 0x109F),),
    "georgian": ((0x10A0, 0x10FF),),
    "ethiopic": ((0x1200, 0x137F),),
    "khmer": ((0x1780, 0x17FF),),
    "hangul": ((0x1100, 0x11FF), (0x3130, 0x318F), (0xAC00, 0xD7AF)),
    "kana": ((0x3040, 0x30FF), (0x31F0, 0x31FF)),
    "han": ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)),
}
_SPANS = sorted((lo, hi, name) for name, spans in _BLOCKS.items() for lo, hi in spans)
_LOWS = [lo for lo, _, _ in _SPANS]

_WORD = re.compile(r"[^\W\d_]+")
# Dotted or @-joined tokens are addresses and versions, not prose (`o.com` would read Portuguese).
# The lookbehind anchors a match at the start of a run, which keeps the scan linear.
_ADDRESS = re.compile(r"(?<![-\w])[-\w]*(?:[@.][-\w]+)+")
# A line with code syntax is not a message in any language.
_CODE = re.compile(r"\w\(|[\[\]{}=;]")
# One character, a joiner, one character: `OS/2`, `a_b`, `C:\DOS` are names. Fixed width on purpose.
_JOINER = re.compile(r"[^\W_][/\\._][^\W_]")
_RUN = re.compile(r"[^\W\d_]{2,}")


def _latin_cp(cp: int) -> bool:
    return cp < 0x02B0 or 0x1E00 <= cp <= 0x1EFF or 0xFF21 <= cp <= 0xFF3A or 0xFF41 <= cp <= 0xFF5A


def _block(cp: int) -> str | None:
    i = bisect.bisect_right(_LOWS, cp) - 1
    if i >= 0 and cp <= _SPANS[i][1]:
        return _SPANS[i][2]
    return None


# --- state to text -------------------------------------------------------------------------------


def leaves(state: Any, depth: int = 0) -> list[str]:
    """The string values of a state, in order. Keys are skipped: they are field names, usually English,
    and say nothing about the customer's language. Bytes are read as UTF-8 or not at all."""
    if state is None or depth > MAX_DEPTH:
        return []
    if isinstance(state, str):
        return [state]
    if isinstance(state, (bytes, bytearray)):
        try:
            return [bytes(state).decode("utf-8")]
        except UnicodeDecodeError:
            return []
    values: Any
    if isinstance(state, Mapping):
        values = state.values()
    elif isinstance(state, (list, tuple)):
        values = state
    else:
        return []
    out: list[str] = []
    for value in values:
        out.extend(leaves(value, depth + 1))
    return out


def window_text(state: Any, limit: int = WINDOW) -> str:
    """The first `limit` characters of the state's values joined by spaces: the whole-state read."""
    parts: list[str] = []
    left = limit
    for leaf in leaves(state):
        if left <= 0:
            break
        parts.append(leaf[:left])
        if len(leaf) >= left:
            break
        left -= len(leaf) + 1
    return " ".join(parts)[:limit]


def _lines(text: str, budget: int) -> Iterator[str]:
    """The lines of `text` without splitting all of it: a 10 MB field yields only what is read."""
    start = 0
    while start <= len(text) and budget > 0:
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        yield text[start:end]
        budget -= end - start + 1
        start = end + 1


# --- scripts -------------------------------------------------------------------------------------


def _letters(text: str) -> int:
    return sum(ch.isalpha() for ch in text)


def _script_shares(text: str) -> tuple[str, dict[str, float]]:
    """Dominant script and each script's share of the letters. Latin is ranked last, so a named
    script wins a tie; scripts otherwise keep the order they first appear in."""
    counts: dict[str, int] = {}
    latin = 0
    for ch in text:
        if not ch.isalpha():
            continue
        cp = ord(ch)
        if _latin_cp(cp):
            latin += 1
        else:
            name = _block(cp) or "other"
            counts[name] = counts.get(name, 0) + 1
    total = latin + sum(counts.values())
    if not total:
        return "unknown", {}
    dominant = max([*counts.items(), ("latin", latin)], key=lambda kv: kv[1])[0]
    shares = {"latin": latin / total} if latin else {}
    shares.update((k, v / total) for k, v in counts.items())
    return dominant, shares


def _foreign_words(text: str) -> list[str]:
    """Runs of one named non-Latin script that look like words: two letters or more and not
    capitalised (a symbol, a name or an IPA transcription inside English is not a request).
    Combining marks are skipped so they never split a word."""
    runs: list[str] = []
    cur: list[str] = []
    cur_script: str | None = None
    for ch in text:
        if unicodedata.combining(ch):
            continue
        cp = ord(ch)
        script = None if cp < 0x0250 or _latin_cp(cp) else _block(cp)
        if script is not None and script == cur_script:
            cur.append(ch)
            continue
        if cur:
            runs.append("".join(cur))
        cur, cur_script = ([ch], script) if script is not None else ([], None)
    if cur:
        runs.append("".join(cur))
    return [r for r in runs if len(r) > 1 and not r[0].isupper()]


def _carries(share: float, letters: int) -> bool:
    return share >= NON_LATIN_SHARE or (share >= NON_LATIN_LONG_SHARE and letters >= NON_LATIN_LETTERS)


# --- Latin language evidence ---------------------------------------------------------------------

_LISTED = [w for words in FUNCTION_WORDS.values() for w in words]
# A word in two lists says "not English" without saying which language, so it cannot name one.
AMBIGUOUS = frozenset(w for w, n in Counter(_LISTED).items() if n > 1) | NORDIC_SHARED
ENGLISH_ONLY = frozenset(FUNCTION_WORDS["en"]) - AMBIGUOUS
_COUNT_ONCE = ENGLISH_COLLISIONS & frozenset(
    w for code, words in FUNCTION_WORDS.items() if code != "en" for w in words)


def _words(text: str) -> list[str]:
    return _WORD.findall(_ADDRESS.sub(" ", text).replace("İ", "i").lower())


def _english_holds(words: list[str], rate: float) -> bool:
    """Two English-only function words and at most one accented word keep a text English despite a
    marginal share of non-English letters (one `José` or `café` in a short sentence)."""
    if rate >= RESCUE_CEILING:
        return False
    distinct = set(words)
    if len(distinct & ENGLISH_ONLY) < 2:
        return False
    return sum(any(ch in NON_ENGLISH_LETTERS for ch in w) for w in distinct) <= 1


def latin_evidence(text: str) -> dict[str, Any]:
    """The Latin-script verdict: `language` (None when undecided), `english_hits`, `diacritic_rate`
    and `looks_non_english` (non-English letters or a Nordic marker, even without a name)."""
    words = _words(text)
    low = text.lower()
    rate = sum(ch in NON_ENGLISH_LETTERS for ch in low) / max(1, len(low))
    marked = rate >= DIACRITIC_FLOOR
    distinct = set(words)
    nordic = bool(distinct & NORDIC_SHARED) and not distinct & ENGLISH_ONLY
    if 1 < len(words) < MIN_WORDS and distinct & SWEDISH_SHORT:
        return {"language": "sv", "english_hits": 0, "diacritic_rate": rate, "looks_non_english": marked}
    if len(words) < MIN_WORDS:
        return {"language": None, "english_hits": 0, "diacritic_rate": rate, "looks_non_english": marked or nordic}
    tally = Counter(words)
    scores = {code: sum(1 if w in _COUNT_ONCE else n for w, n in tally.items() if w in listed)
              for code, listed in FUNCTION_WORDS.items()}
    english = scores["en"]
    best, top = None, 0
    for code, score in scores.items():  # first listed wins a tie
        if code == "en" or not any(w not in AMBIGUOUS for w in distinct & FUNCTION_WORDS[code]):
            continue
        if best is None or score > top:
            best, top = code, score
    lang = None
    if best and top >= max(2, english + 2):
        lang = best
    elif (best == "sv" and "inte" in distinct and "kan" in distinct and words[0] in ("kan", "jag", "vi")
          and english <= 1):
        lang = best  # "kan inte logga in": Swedish despite the English-looking `in`
    elif best and marked and top >= max(2, english):
        lang = best
    elif english and (not marked or _english_holds(words, rate)):
        lang = "en"
    return {"language": lang, "english_hits": english, "diacritic_rate": rate,
            "looks_non_english": marked or (lang is None and nordic)}


def _shouted(text: str) -> bool:
    """Cased text in capitals only (caseless scripts are never shouted)."""
    return any(ch.isupper() for ch in text) and not any(ch.islower() for ch in text)


def _shout_believed(tokens: list[str], lang: str, rate: float) -> bool:
    """An all-caps verdict stands on a long word plus non-English letters or a long function word;
    acronyms (`MON DES EST LA`) have neither."""
    if all(len(t) < SHOUT_WORD for t in tokens):
        return False
    if rate >= DIACRITIC_FLOOR:
        return True
    return any(len(w) >= SHOUT_STOPWORD for w in {t.lower() for t in tokens} & FUNCTION_WORDS.get(lang, set()))


def _blank_caps(text: str) -> str:
    return _RUN.sub(lambda m: " " if m.group().isupper() else m.group(), text)


def _read(text: str) -> dict[str, Any]:
    """Detection for one flattened text (no per-line look: `analyse` adds that)."""
    dominant, shares = _script_shares(text)
    non_latin = round(1.0 - shares.get("latin", 0.0), 4) if shares else 0.0
    n_non_latin = round(non_latin * _letters(text))
    carried = _carries(non_latin, n_non_latin)
    if dominant == "latin" and carried and _foreign_words(text):
        others = {k: v for k, v in shares.items() if k != "latin"}
        dominant = max(others, key=others.__getitem__)
    base = {"script": dominant, "script_profile": shares, "language": None, "language_undecided": True,
            "diacritic_rate": 0.0, "mixed_segment": None}
    if dominant == "unknown":
        return {**base, "is_english": True, "non_latin_fraction": 0.0}
    if dominant != "latin":
        return {**base, "is_english": False, "non_latin_fraction": non_latin}
    ev = latin_evidence(text)
    lang = ev["language"]
    if lang not in (None, "en") and not carried:
        if _shouted(text):
            if not _shout_believed(_WORD.findall(text), lang, float(ev["diacritic_rate"])):
                lang = None
        else:
            caps = [m.group() for m in _RUN.finditer(text) if m.group().isupper()]
            if caps and max(map(len, caps)) < SHOUT_WORD:
                blanked = _blank_caps(text)
                if blanked != text:
                    lang = latin_evidence(blanked)["language"]
    undecided = lang is None
    return {**base, "language": lang, "language_undecided": undecided,
            "is_english": lang == "en" or (undecided and not ev["looks_non_english"]),
            "diacritic_rate": round(float(ev["diacritic_rate"]), 4), "non_latin_fraction": non_latin}


def _prose_language(line: str) -> str | None:
    """The foreign language one line is written in, on stricter evidence than a whole state: no code,
    no joined names or acronyms, four words, and two different function words of that language."""
    if not line.strip() or _CODE.search(line):
        return None
    prose = " ".join(t for t in line.split() if not _JOINER.search(t))
    loud = _shouted(prose)
    if not loud:
        prose = _blank_caps(prose)
    tokens = _WORD.findall(prose)
    if len(tokens) < MIN_WORDS:
        return None
    ev = latin_evidence(prose)
    lang = ev["language"]
    if lang in (None, "en"):
        return None
    if loud and not _shout_believed(tokens, lang, float(ev["diacritic_rate"])):
        return None
    if len({t.lower() for t in tokens} & FUNCTION_WORDS.get(lang, set())) < 2:
        return None
    return lang


def _foreign_line(state: Any, limit: int = WINDOW) -> tuple[str, str] | None:
    """The first line or field, within `limit` characters in all, that names a foreign language."""
    seen = 0
    for leaf in leaves(state):
        for line in _lines(leaf, FIELD_BUDGET):
            if seen >= limit:
                return None
            line = line[:limit - seen]
            seen += len(line)
            lang = _prose_language(line)
            if lang:
                return lang, line.strip()
    return None


def _foreign_field(leaf: str, budget: int) -> tuple[dict[str, Any] | None, int]:
    """The longest line of one field that the English checkpoint cannot read, read on its own
    (each line up to 4000 characters), else None; and how many characters of `budget` it walked.
    Names, acronyms and code stay out."""
    best: dict[str, Any] | None = None
    most = -1
    used = 0
    for line in _lines(leaf, budget):
        used += len(line) + 1
        if len(line) < 7:  # too short for four words or ten letters
            continue
        sample = line[:WINDOW]
        if not sample.strip() or _CODE.search(sample):
            continue
        det = _read(sample)
        if det["is_english"]:
            continue
        named = det["language"] not in (None, "en") and _prose_language(sample) is not None
        if not named:
            if det["script"] not in ("latin", "unknown"):
                if not (_foreign_words(sample) and _letters(sample) >= NON_LATIN_LETTERS):
                    continue
            elif not (det["diacritic_rate"] >= DIACRITIC_FLOOR and len(_WORD.findall(sample)) >= MIN_WORDS):
                continue
        n = _letters(sample)
        if n > most:
            most, best = n, det
    return best, used


def analyse(state: Any) -> dict[str, Any]:
    """Detection for a state (str, bytes, mapping, list of turns or None).

    Keys: `script` ("latin", "han", ..., "unknown" without letters), `script_profile`,
    `non_latin_fraction`, `language` (a code or None), `language_undecided`, `is_english`,
    `diacritic_rate` and `mixed_segment` (the foreign line that flipped an English state).

    A state that reads English as a whole is looked at again line by line and, when structured,
    field by field: a short Portuguese message under a long English template is still Portuguese,
    and sending it to the English checkpoint costs calibration, not a few points.
    """
    result = _read(window_text(state))
    if result["script"] == "latin" and result["is_english"]:
        values = leaves(state)
        if len(values) > 1 or any("\n" in v for v in values):
            found = _foreign_line(state)
            if found:
                result = {**result, "language": found[0], "is_english": False, "language_undecided": False,
                          "mixed_segment": found[1]}
    if isinstance(state, (str, bytes, bytearray)) or state is None or not result["is_english"]:
        return result
    best: dict[str, Any] | None = None
    most = -1
    budget = FIELD_BUDGET
    for leaf in leaves(state):
        if budget <= 0:
            break
        det, used = _foreign_field(leaf, budget)
        budget -= used
        if det is not None:
            n = _letters(leaf[:WINDOW])
            if n > most:
                most, best = n, det
    if best is None:
        return result
    return {**result, "language": best["language"], "is_english": False,
            "language_undecided": best["language_undecided"]}
