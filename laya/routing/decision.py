"""The routing decision and its reason, worded exactly as upstream laya 0.4.15 words it.

The reason is reported on every routed answer (`x_route_reason`), so callers compare it with what
upstream reported for the same state: the text and its rounding are part of the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from laya.routing.language import analyse

ENGLISH_CODES = frozenset({"en", "eng", "english"})
# Codes that are legitimate locale values but name no language (`LANG=C`, ISO 639-2 `und`, `zxx`,
# `mul`): they say nothing about the state, so detection decides as if no code had been given.
NO_LANGUAGE_CODES = frozenset({"c", "posix", "und", "zxx", "mul"})


@dataclass(frozen=True)
class Route:
    """Where a state goes (`model`: "english" or "multilingual"), why, and the detection behind it
    (None when an explicit language code decided)."""

    model: str
    reason: str
    detection: dict[str, Any] | None = None


def english_code(code: str | None) -> bool | None:
    """Whether a language code (`en`, `EN`, `en-US`, `en_US.UTF-8`, `pt-BR`) names English, or None
    when it names no language at all (blank, `C`, `und`)."""
    if code is None:
        return None
    text = str(code).strip().lower().partition(".")[0]
    primary = text.replace("_", "-").partition("-")[0]
    if not primary or primary in NO_LANGUAGE_CODES:
        return None
    return primary in ENGLISH_CODES


def route(state: Any, *, lang: str | None = None, default: str = "multilingual") -> Route:
    """The checkpoint for `state`. An explicit `lang` naming a language decides outright; otherwise
    the state's script and language do, and `default` takes a state nothing identifies (no letters,
    or Latin text too short or too plain to name a language)."""
    if lang is not None:
        english = english_code(lang)
        if english is not None:
            return Route("english" if english else "multilingual", f"explicit lang={lang!r}")
    det = analyse(state)
    if det["script"] == "unknown":
        return Route(default, f"no letters detected in state; using default ({default})", det)
    if det["script"] != "latin":
        share = 100 * float(det["non_latin_fraction"])
        return Route("multilingual", f"non-Latin script ({det['script']}, {share:.0f}% of letters); "
                                     "the English checkpoint cannot read it", det)
    if not det["is_english"]:
        if det.get("mixed_segment"):
            reason = (f"Latin script, mostly English, but a line or field reads as {det['language']!r} "
                      f"({det['mixed_segment'][:60]!r}); the English checkpoint cannot read it")
        elif det["language"]:
            reason = f"Latin script but language looks like {det['language']!r}, not English"
        else:
            share = 100 * float(det["diacritic_rate"])
            reason = (f"Latin script, language not identified but {share:.0f}% non-English letters; "
                      "not safe for the English checkpoint")
        return Route("multilingual", reason, det)
    if det["language_undecided"]:
        return Route(default, "Latin script, language not identified and no non-English letters; "
                              f"using default ({default})", det)
    return Route("english", "English Latin text", det)
