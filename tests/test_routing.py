"""`laya.routing` against upstream laya 0.4.15's Router: for every recorded state (tests/golden/routing.json,
hand-picked and generated, made by tests/golden/make_routing_golden.py) the same model and the
identical reason text. Plus the properties upstream's cases cannot show: bounded work on huge states,
bytes, nesting, and the shape of the result. No model is loaded here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from laya.routing import Route, analyse, route
from laya.routing.decision import english_code

GOLDEN = json.loads((Path(__file__).parent / "golden" / "routing.json").read_text(encoding="utf-8"))
CASES = GOLDEN["cases"]
GERMAN = "Ich habe meine Bestellung vor einer Woche aufgegeben und sie ist noch nicht da."
ENGLISH = "I was billed twice this month and would like the extra charge returned."


def test_the_golden_holds_both_sets():
    sets = {c["set"] for c in CASES}
    assert sets == {"hand", "generated"} and GOLDEN["upstream"] == "0.4.15"
    assert sum(c["set"] == "generated" for c in CASES) == GOLDEN["generated"] >= 300


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_same_route_and_reason_as_upstream(case):
    got = route(case["state"], lang=case.get("lang"), default=case["default"])
    assert (got.model, got.reason) == (case["model"], case["reason"])


def test_route_is_a_frozen_record():
    got = route(ENGLISH)
    assert isinstance(got, Route) and got.model == "english" and got.detection["language"] == "en"
    with pytest.raises(AttributeError):
        got.model = "multilingual"  # type: ignore[misc]
    assert route(ENGLISH, lang="de").detection is None


@pytest.mark.parametrize(("code", "english"), [("en", True), ("EN-us", True), ("en_US.UTF-8", True), ("eng", True),
                                               ("de", False), ("pt-BR", False), ("xx", False), (" ", None),
                                               ("", None), ("C", None), ("C.UTF-8", None), ("und", None)])
def test_language_codes(code, english):
    assert english_code(code) is english


def test_bytes_read_as_utf8_and_undecodable_bytes_have_no_letters():
    assert route(GERMAN.encode()) == route(GERMAN)
    assert route({"body": GERMAN.encode()}).model == "multilingual"
    assert route(b"\xff\xfe\xfa").reason.startswith("no letters detected")


def test_nesting_is_read_to_a_depth_and_no_further():
    def nest(depth: int) -> object:
        state: object = GERMAN
        for _ in range(depth):
            state = {"x": state}
        return state
    assert route(nest(6)).reason == "Latin script but language looks like 'de', not English"
    assert route(nest(7)).reason.startswith("no letters detected")
    assert route([("user", GERMAN)]).model == "multilingual"  # tuples and lists alike
    assert route({"n": 5, "ok": True, "x": 1.5}).reason.startswith("no letters detected")


@pytest.mark.parametrize("shape", ["text", "lines", "field", "many-fields"])
def test_a_ten_megabyte_state_routes_quickly(shape):
    big = ENGLISH + " " + "x" * 10_000_000
    state = {"text": big, "lines": (GERMAN + "\n") * 120_000, "field": {"note": ENGLISH, "body": big},
             "many-fields": [{"content": ENGLISH}] * 50_000}[shape]
    start = time.perf_counter()
    got = route(state)
    assert time.perf_counter() - start < 5.0
    assert got.model in ("english", "multilingual")


def test_one_german_field_in_an_english_object():
    got = route({"note": ENGLISH + " " + ENGLISH, "message": GERMAN})
    assert got.model == "multilingual" and "'de'" in got.reason
    det = analyse({"note": ENGLISH, "message": GERMAN})
    assert det["is_english"] is False and det["language"] == "de"


def test_analyse_reports_the_keys_the_router_reads():
    for state in (ENGLISH, GERMAN, "注文", "", None, {"a": [ENGLISH]}, [{"role": "user", "content": GERMAN}]):
        det = analyse(state)
        assert {"script", "non_latin_fraction", "is_english", "language", "mixed_segment", "diacritic_rate",
                "language_undecided"} <= det.keys()


def test_default_takes_what_nothing_identifies():
    assert route("Quero cancelar", default="english").model == "english"
    assert route("Quero cancelar").model == "multilingual"
    assert route("12345", default="english").reason == "no letters detected in state; using default (english)"
