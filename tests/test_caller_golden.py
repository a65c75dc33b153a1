"""What upstream gives a caller besides `predict`, held to upstream's own answers (issue 27).

`tests/golden/caller.json` (made by `tests/golden/make_caller_golden.py` with upstream laya 0.4.15 on
both golden checkpoints): schema decisions (the plan of every schema, the refusals word for word, the
values, details and `min_confidence` gate over three states) and long states (`predict_long`: the
rows every window was read from, token for token, the deciding window of every answer, the answers
to 1e-4, the refusals). Upstream reports 4 decimals, so probabilities are compared to 1e-4.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from conftest import load_quiet

from laya.errors import QuestionError
from laya.request import Scan
from laya.structured import plan_schema

GOLDEN = Path(__file__).parent / "golden"
RECORD = json.loads((GOLDEN / "caller.json").read_text(encoding="utf-8"))
TOL = 1e-4 + 1e-9
_MODELS: dict = {}


def golden_model(name: str):
    if name not in _MODELS:
        _MODELS[name] = load_quiet(GOLDEN / RECORD["checkpoints"][name], "torch")
    return _MODELS[name]


def each(part: str):
    return [pytest.param(name, case, got, id=f"{name}-{case['id']}")
            for name in RECORD["checkpoints"]
            for case, got in zip(RECORD[part], RECORD["results"][name][part], strict=True)]


def close(got: float, want: float, where: str) -> None:
    assert abs(float(got) - float(want)) <= TOL, f"{where}: {got} vs upstream {want}"


def test_the_goldens_cover_what_the_issue_names():
    ids = {c["id"] for c in RECORD["schema"]}
    assert {"ticket", "ticket-gated", "ticket-gated-map", "v1-style"} <= ids
    assert sum(i.startswith("refused-") for i in ids) >= 20
    longs = {c["id"]: c for c in RECORD["long"]}
    kinds = {type(c["state"]).__name__ for c in longs.values()}
    assert kinds == {"str", "dict", "list"}  # string, object and conversation states past the window
    for name in RECORD["checkpoints"]:
        windows = [r["response"]["usage"]["windows"] for r in RECORD["results"][name]["long"] if "response" in r]
        assert max(windows) >= 10 and 1 in windows


@pytest.mark.parametrize(("name", "case", "want"), each("schema"))
def test_schema_decisions_equal_upstream(name, case, want):
    model = golden_model(name)
    if "error" in want:
        with pytest.raises(QuestionError) as caught:
            model.decide_batch(case["states"], case["schema"], return_details=True,
                               min_confidence=case.get("min_confidence"))
        assert f"{type(caught.value).__name__}: {caught.value}" == want["error"]
        return
    fields = plan_schema(case["schema"])
    planned = [{"name": f.name, "kind": f.kind, "question": f.question,
                "options": [[label, value] for label, value in f.options]} for f in fields]
    assert planned == [{k: f[k] for k in ("name", "kind", "question", "options")} for f in want["plan"]["fields"]]
    assert [f.minimum for f in fields if f.kind == "score"] == \
        [f["minimum"] for f in want["plan"]["fields"] if f["kind"] == "score"]
    results = model.decide_batch(case["states"], case["schema"], return_details=True,
                                 min_confidence=case.get("min_confidence"))
    assert len(results) == len(want["results"])
    for i, (got, up) in enumerate(zip(results, want["results"])):
        where = f"{name}/{case['id']}/state {i}"
        assert got.values == up["values"], where
        assert list(got.probabilities) == list(up["probabilities"]), where
        for field, p in up["probabilities"].items():
            assert list(got.probabilities[field]) == list(p), (where, field)
            for key, value in p.items():
                close(got.probabilities[field][key], value, f"{where} {field}[{key}]")
            close(got.confidence[field], up["confidence"][field], f"{where} {field} confidence")
            close(got.answer_confidence[field], up["answer_confidence"][field], f"{where} {field} answer_confidence")
            ours, theirs = got.answers[field], up["answers"][field]
            assert ours.get("x_abstention") == theirs.get("abstention"), (where, field)
            assert bool(ours.get("x_low_confidence")) == bool(theirs.get("low_confidence")), (where, field)
            assert ours.get("x_abstention_threshold") == theirs.get("abstention_threshold"), (where, field)


def scan_of(case: dict) -> Scan:
    return Scan(case.get("window"), case.get("stride"), case.get("aggregate", "auto"))


@pytest.mark.parametrize(("name", "case", "want"), each("long"))
def test_long_states_equal_upstream(name, case, want):
    model = golden_model(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if "error" in want:
            with pytest.raises(QuestionError) as refused:
                model.predict_long(case["state"], case["questions"], case.get("window"), case.get("stride"),
                                   case.get("aggregate", "auto"))
            assert f"ValueError: {refused.value}" == want["error"]
            return
        job = model.prepare([case["state"]], case["questions"], overflow=scan_of(case))
        got = model.predict_long(case["state"], case["questions"], case.get("window"), case.get("stride"),
                                 case.get("aggregate", "auto"))
    ours = [w for w in caught if "predict_long" in str(w.message)]
    assert len(ours) == 2 * len(want["warnings"])  # prepare and predict_long each warn as upstream does once
    assert [list(row.ids) for rows in job.rows for row in rows] == want["rows"], "windows not token-identical"
    assert job.windows[0].n_tokens == want["state_tokens"]
    response = want["response"]
    assert got["x_usage"]["windows"] == response["usage"]["windows"]
    assert got["x_usage"]["rows"] == len(want["rows"])
    for qid, up in response["answers"].items():
        mine = got["answers"][qid]
        assert mine.get("x_window") == up.get("window"), f"{name}/{case['id']} {qid}: deciding window"
        if up["type"] == "noul":
            close(mine["noul"], up["noul"], f"{qid} noul")
        else:
            if up["type"] == "choice":
                assert mine["choice"] == up["choice"], f"{qid} choice"
            else:
                close(mine["score"], up["score"], f"{qid} score")
            for key, value in up["probabilities"].items():
                close(mine["probabilities"][key], value, f"{qid}[{key}]")
        close(mine["x_act_probability"], up["action"]["act_probability"], f"{qid} act")


# --- calibration files -----------------------------------------------------------------------------

CALIBRATION = RECORD["calibration"]


def calibrated_model(name: str, file: Path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_quiet(GOLDEN / RECORD["checkpoints"][name], "torch", calibration=file)
    return model, sorted({w.category.__name__ for w in caught if w.category is UserWarning})


def calibration_files(name: str) -> dict[str, Path]:
    files = {k: GOLDEN / v for k, v in CALIBRATION["files"].items()}
    files["upstream-written"] = GOLDEN / "calibration" / f"upstream-{name}.json"  # upstream's save_calibration
    files["ours"] = GOLDEN / "calibration" / f"ours-{name}.json"  # `laya calibrate --format upstream`
    return files


def same_answer(mine: dict, up: dict, where: str) -> None:
    kind = up["type"]
    if kind == "noul":
        close(mine["noul"], up["noul"], f"{where} noul")
    else:
        if kind == "choice":
            assert mine["choice"] == up["choice"], f"{where} choice"
        else:
            close(mine["score"], up["score"], f"{where} score")
        for key, value in up["probabilities"].items():
            close(mine["probabilities"][key], value, f"{where}[{key}]")
    close(mine["x_answer_confidence"], up["answer_confidence"], f"{where} answer confidence (binned)")
    close(mine["x_act_probability"], up["action"]["act_probability"], f"{where} act")
    assert bool(mine.get("x_low_confidence")) == bool(up.get("low_confidence")), f"{where} low confidence"
    assert mine.get("x_abstention") == up.get("abstention"), f"{where} abstention"
    assert mine.get("x_abstention_threshold") == up.get("abstention_threshold"), f"{where} threshold"
    assert mine.get("x_window") == up.get("window"), f"{where} deciding window"


def each_file():
    return [pytest.param(name, file, id=f"{name}-{file}") for name in RECORD["checkpoints"]
            for file in ("hand", "version-1", "upstream-written", "ours")]


@pytest.mark.parametrize(("name", "file"), each_file())
def test_calibration_files_apply_as_upstream_applies_them(name, file):
    """Each file loaded here answers as upstream answered with it loaded: its temperatures by bucket
    (clamped and forgiven the way upstream forgives), its binning of the answer confidence, the
    `min_confidence` gates on the binned value, and a scan ranking windows by it. "ours" is the file
    `laya calibrate --format upstream` wrote, so this is also upstream loading ours."""
    want = RECORD["results"][name]["calibration"]["applied"][file]
    path = calibration_files(name)[file]
    model, warned = calibrated_model(name, path)
    if file == "hand":  # it names another checkpoint: upstream warns and loads anyway, as we do
        assert warned == ["UserWarning"] and "UserWarning" in want["warnings"]
    temps = model.temperatures
    assert list(temps.per_type) == \
        pytest.approx(want["temperature"], abs=1e-12)
    for bucket, value in want["temperature_by_options"].items():
        if bucket in temps.by_bucket or not bucket.startswith("nonsense"):
            assert temps.by_bucket[bucket] == pytest.approx(value, abs=1e-12), bucket
    assert model.binning == ({k: tuple(v["values"]) for k, v in want["binning_map"].items()}
                             if want["binning_map"] else None)
    for i, case in enumerate(want["answers"]):
        got = model.predict(case["state"], CALIBRATION["questions"], min_confidence=case["gate"])
        for qid, up in case["response"]["answers"].items():
            same_answer(got["answers"][qid], up, f"{name}/{file} #{i} {qid}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scan = model.predict_long(CALIBRATION["states"][-1], CALIBRATION["questions"], 60)
    assert scan["x_usage"]["windows"] == want["scan"]["usage"]["windows"]
    for qid, up in want["scan"]["answers"].items():
        same_answer(scan["answers"][qid], up, f"{name}/{file} scan {qid}")


@pytest.mark.parametrize("name", list(RECORD["checkpoints"]))
def test_malformed_calibration_files_are_refused_in_upstreams_words(name):
    from laya.errors import CheckpointError

    refused = RECORD["results"][name]["calibration"]["refused"]
    assert set(refused) == set(CALIBRATION["malformed"]) and all(refused.values())
    for key, relative in CALIBRATION["malformed"].items():
        path = GOLDEN / relative
        with pytest.raises(CheckpointError) as caught:
            load_quiet(GOLDEN / RECORD["checkpoints"][name], "torch", calibration=path)
        assert str(caught.value) == f"{path}: {refused[key].removeprefix('ValueError: ')}", key


@pytest.mark.parametrize("name", list(RECORD["checkpoints"]))
def test_fit_binning_equals_upstreams(name):
    """Upstream's `fit_binning` over every labelled answer of the records at the temperatures it had
    fitted (those it saved) is ours over the same answers at those temperatures."""
    from laya.calibration.data import read_records
    from laya.calibration.file import load_calibration
    from laya.calibration.run import collect
    from laya.calibration.upstream import fit_binning

    up = RECORD["results"][name]["calibration"]
    temperatures = load_calibration(calibration_files(name)["upstream-written"]).whole
    samples = [s for per_record in collect(golden_model(name), read_records(GOLDEN / CALIBRATION["records"]))
               for s in per_record]
    ours = fit_binning(samples, temperatures, min_bucket=CALIBRATION["fit_min_bucket"])
    assert sorted(ours) == sorted(up["fitted_binning"])
    for bucket, entry in up["fitted_binning"].items():
        assert ours[bucket]["bins"] == entry["bins"]
        assert ours[bucket]["values"] == pytest.approx(entry["values"], abs=1e-9), bucket
    assert up["written"]["binning_map"] == up["fitted_binning"]


def test_laya_calibrate_format_upstream_writes_the_file_upstream_loaded(tmp_path):
    """The file the goldens hold as "ours" (which upstream loaded and answered with, above) is what
    `laya calibrate --format upstream --binning` writes; its identity names the checkpoint."""
    from laya.cli import main

    name = "modernbert"
    out = tmp_path / "cal.json"
    checkpoint = GOLDEN / RECORD["checkpoints"][name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert main(["calibrate", str(checkpoint), str(GOLDEN / CALIBRATION["records"]), "-r", "torch",
                     "--format", "upstream", "--binning", "--binning-min-bucket", str(CALIBRATION["fit_min_bucket"]),
                     "--min-bucket", "20", "--out", str(out)]) == 0
    written = json.loads(out.read_text(encoding="utf-8"))
    held = json.loads(calibration_files(name)["ours"].read_text(encoding="utf-8"))
    assert written["version"] == 2 and "format" not in written
    assert written["model_id_or_path"] == str(checkpoint) and written["config"] == held["config"]
    assert written["temperature"] == pytest.approx(held["temperature"], abs=1e-6)
    assert written["temperature_by_options"] == pytest.approx(held["temperature_by_options"], abs=1e-6)
    assert sorted(written["binning_map"]) == sorted(held["binning_map"])
    for bucket, entry in held["binning_map"].items():
        assert written["binning_map"][bucket]["values"] == pytest.approx(entry["values"], abs=1e-9), bucket
