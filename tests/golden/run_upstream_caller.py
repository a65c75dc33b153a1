"""Runs INSIDE the upstream virtual environment (upstream `laya` 0.4.15 installed there).

Reads a job JSON (checkpoint folders, schema cases, long-state cases), answers each with upstream's
`laya.structured.decide_batch` and `Agent.predict_long` on the CPU in fp32, and writes what came
back, as upstream reports it (rounded), with the rows each window was read from. Never imported by
our package or tests: upstream has the same import name as ours.
"""

import json
import sys
import warnings

import laya.agent as upstream
import laya.calibrate as calibrate  # noqa: I001 - upstream's modules, not ours
import torch

import laya.structured as structured


def plan(schema):
    try:
        fields = structured.plan_from_json_schema(schema)
    except Exception as exc:  # recorded: ours must refuse the same schemas with the same words
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"fields": [{"name": f.name, "kind": f.kind, "question": f.question,
                        "options": [[label, value] for label, value in f.options], "minimum": f.minimum}
                       for f in fields]}


def decided(agent, case):
    try:
        results = structured.decide_batch(agent, case["states"], case["schema"], return_details=True,
                                          min_confidence=case.get("min_confidence"))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"results": [{"values": r.values, "confidence": r.confidence, "probabilities": r.probabilities,
                         "answer_confidence": r.answer_confidence, "answers": r.answers, "usage": r.usage}
                        for r in results]}


def scanned(agent, case, rows):
    rows.clear()
    kwargs = {k: case[k] for k in ("window", "stride", "aggregate") if k in case}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = agent.predict_long(case["state"], case["questions"], **kwargs)
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    ids = upstream.encode_text(agent.tok, upstream.serialize_state(case["state"]).replace(agent.tok.mask_token, " "),
                               add_special_tokens=False)["input_ids"]
    return {"response": result, "rows": [list(r) for r in rows], "state_tokens": len(ids),
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught
                         if "predict_long" in str(w.message)]}


def targets_of(questions, labels):
    """One-hot targets in upstream's option order (a yes/no's: false, true)."""
    out = {}
    for qid, q in questions.items():
        label = labels[qid]
        if q["type"] == "noul":
            out[qid] = [0.0, 1.0] if label else [1.0, 0.0]
        elif q["type"] == "score":
            out[qid] = [1.0 if i == label else 0.0 for i in range(len(q["criteria"]))]
        else:
            out[qid] = [1.0 if key == label else 0.0 for key in q["criteria"]]
    return out


def calibrated(agent, job, written_path):
    """Fit and save a file upstream's way; then every file loaded and applied; the malformed refused."""
    cal = job["calibration"]
    pairs = [(r["state"], r["questions"], targets_of(r["questions"], r["labels"])) for r in cal["records"]]
    records = calibrate.records_from_labeled(agent, pairs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        agent.fit_temperatures(records)
    fitted_map = agent.fit_binning(records, min_bucket_n=cal["fit_min_bucket"])
    agent.save_calibration(written_path)
    with open(written_path, encoding="utf-8") as handle:
        written = json.load(handle)
    files = dict(cal["files"], **{"upstream-written": written_path})
    applied = {}
    for name, path in files.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            agent.load_calibration(path)
        answers = []
        for state in cal["states"]:
            for gate in cal["gates"]:
                answers.append({"state": state, "gate": gate,
                                "response": agent.system_one(state, cal["questions"], min_confidence=gate)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scan = agent.predict_long(cal["states"][-1], cal["questions"], window=60)
        applied[name] = {"temperature": list(agent.temperature),
                         "temperature_by_options": dict(agent.temperature_by_options),
                         "binning_map": agent.binning_map, "answers": answers, "scan": scan,
                         "warnings": sorted({w.category.__name__ for w in caught})}
    refused = {}
    for name, path in cal["malformed"].items():
        try:
            agent.load_calibration(path)
            refused[name] = None
        except Exception as exc:
            refused[name] = f"{type(exc).__name__}: {exc}"
    return {"written": written, "fitted_binning": fitted_map, "applied": applied, "refused": refused}


def main(job_path: str, out_path: str) -> None:
    with open(job_path, encoding="utf-8") as handle:
        job = json.load(handle)
    torch.manual_seed(0)
    results = {}
    for name, spec in job["checkpoints"].items():
        agent = upstream.Agent(spec["path"], device="cpu")
        rows = []
        original = agent._encode_state

        def capture(*args, _orig=original, rows=rows, **kwargs):
            items = _orig(*args, **kwargs)
            rows.extend([list(it["ids"]) for it in items])
            return items

        agent._encode_state = capture
        results[name] = {
            "schema": [{"id": c["id"], "plan": plan(c["schema"]), **decided(agent, c)} for c in job["schema"]],
            "long": [{"id": c["id"], **scanned(agent, c, rows)} for c in job["long"]],
        }
        if "calibration" in job:
            agent = upstream.Agent(spec["path"], device="cpu")
            job["calibration"]["files"] = dict(job["calibration"]["common_files"], ours=spec["ours"])
            results[name]["calibration"] = calibrated(agent, job, spec["written"])
    meta = {"laya": __import__("laya").__version__, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__}
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump({"upstream": meta, "results": results}, handle, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
