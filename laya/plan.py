"""A plan before the forward pass: what a request will cost and what will be cut, for either engine
(`POST /v1/systemone/plan`, `laya plan`, the MCP `plan` tool).

An engine's `plan` prepares the request as `prepare` does (validation, tokenising, rows or prompts)
and runs nothing. It counts against the server's limits times `HEADROOM`, so it can say by how much
a request is over (a plain request stops counting at the first limit), while its own work stays
bounded like any request's. What the engine would refuse is reported as the refusal it would give,
not raised: a plan is where a caller learns it.
"""

from __future__ import annotations

from typing import Any

from laya.errors import QuestionError
from laya.limits import LimitExceeded, Limits

HEADROOM = 4  # a plan counts up to four times each limit
NEAR = 0.8  # a figure at 80% of its limit or more is near it


def limit_report(limits: Limits, figures: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each counted figure beside its limit: `ok`, `near` (at least NEAR of it) or `over`."""
    out = {}
    for what, value in figures.items():
        limit, flag = limits.bound(what)
        status = "over" if value > limit else "near" if value >= NEAR * limit else "ok"
        out[what] = {"value": int(value), "max": limit, "flag": flag, "status": status}
    return out


def refusal(exc: QuestionError) -> dict[str, Any]:
    """What the forward pass would answer instead: its HTTP status, error type and message."""
    from laya.api import question_error

    return {"status": question_error(exc).status, "error_type": exc.error_type, "message": str(exc)[:1000]}


def report(name: str, describe: dict[str, Any], limits: Limits, *, states: list[dict[str, Any]],
           figures: dict[str, int], exact: bool, refused: QuestionError | None = None) -> dict[str, Any]:
    """The plan of one request for one served model. `figures`: the counted work (rows, tokens,
    decisions, questions, states) held against `limits`; `exact`: whether every token figure is the
    one the forward pass will report (a tournament's later rounds are only bounded)."""
    if isinstance(refused, LimitExceeded):  # counted against the headroom: told against the real limit
        limit, flag = limits.bound(refused.what)
        figures = {**figures, refused.what: refused.got}
        refused = LimitExceeded(refused.what, refused.got, limit, flag)
    checked = limit_report(limits, figures)
    out: dict[str, Any] = {
        "object": "systemone.plan",
        "model": name,
        "engine": describe.get("kind", ""),
        "runtime": describe.get("runtime", ""),
        "precision": describe.get("precision", ""),
        "rows": sum(s.get("rows", 0) for s in states),
        "input_tokens": sum(s.get("input_tokens", 0) for s in states),
        "input_tokens_exact": exact,
        "states": states,
        "limits": checked,
        **_statuses(checked),
        "refused": None,
    }
    if refused is not None:
        out["refused"] = refusal(refused)
    return out


def _statuses(checked: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {status: [what for what, c in checked.items() if c["status"] == status] for status in ("near", "over")}


def merged(model: str, plans: list[dict[str, Any]], states: list[dict[str, Any]]) -> dict[str, Any]:
    """One plan from the plans of a request's parts on several models (`model` "auto"): figures
    summed, each limit's largest figure kept, the first refusal; `states` in the request's order."""
    limits: dict[str, Any] = {}
    for one in plans:
        for what, entry in one["limits"].items():
            if what not in limits or entry["value"] > limits[what]["value"]:
                limits[what] = entry
    return {"object": "systemone.plan", "model": model,
            "models": {p["model"]: {k: p[k] for k in ("engine", "runtime", "precision")} for p in plans},
            "rows": sum(p["rows"] for p in plans), "input_tokens": sum(p["input_tokens"] for p in plans),
            "input_tokens_exact": all(p["input_tokens_exact"] for p in plans),
            "states": states, "limits": limits, **_statuses(limits),
            "refused": next((p["refused"] for p in plans if p["refused"]), None)}
