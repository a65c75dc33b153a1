"""A state longer than the row, read in overlapping windows: how they are sized and cut, and how
their answers make one (`Model.predict_long`, and a request's `"x_overflow": {"scan": ...}`).

The rules are upstream's (laya 0.4.15, `Agent.predict_long` and `common.window_budget`), so the
windows are the same tokens and the same window decides:
- the window defaults to `max(64, max_len - head_max_len - 8)` state tokens and is capped at the
  smallest room the questions leave (`max_len - head - 1`); an explicit window wider than that is
  clamped with a `RuntimeWarning`, the default one warned about only when cut by half or more;
- the stride defaults to half the window; one past the window is refused (tokens between two
  windows would be read by none), unless it was valid for the window asked and the clamp made it so;
- a state within the room (or within an explicit window) is read in one pass, as it is;
- otherwise windows start every stride tokens, the last one ending at the state's end; each is
  decoded back to text and read as a state of its own (so a conversation's windows are of its
  JSON text, and each window is cut at its end if its text comes back longer);
- a yes/no takes the window of the highest P(yes), a choice or a score the window of the highest
  top probability (4 places, the first of equals); that window's answer is the answer, with
  `x_window` = `{index, token_start, token_end, count}` into the state's tokens.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from laya.errors import QuestionError
from laya.request import AGGREGATES, Scan
from laya.response import SystemOneResponse

CLAMP_WARN_RATIO = 2


@dataclass(frozen=True)
class Windows:
    """How one state is read: one pass (`starts` empty), or windows of `size` tokens at `starts`."""

    size: int
    step: int
    n_tokens: int
    starts: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return max(1, len(self.starts))


def check_scan(scan: Scan) -> None:
    for name in ("window", "stride"):
        value = getattr(scan, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise QuestionError(f"predict_long: {name} must be an integer, got {value!r}"[:300],
                                error_type="invalid_scan")
    if scan.aggregate not in AGGREGATES:
        raise QuestionError("predict_long: only aggregate='auto' is supported", error_type="invalid_scan")


def plan(rooms: list[int], max_len: int, head_max_len: int, scan: Scan) -> tuple[int, int, int]:
    """(window, stride, room) for these questions' rooms."""
    check_scan(scan)
    window = scan.window
    explicit = window is not None and window > 0
    requested = window if window is not None and window > 0 else max(64, max_len - head_max_len - 8)
    size = requested
    room = min(rooms) if rooms else size
    if room <= 0:
        raise QuestionError(f"predict_long: the questions' options fill the whole sequence (max_len={max_len}, "
                            f"head_max_len={head_max_len}), leaving no room for the state; no window can carry "
                            "any of it", error_type="invalid_scan")
    if size > room:
        if explicit:
            warnings.warn(f"laya: predict_long: window={size} is wider than the {room} state tokens these "
                          f"questions leave inside max_len={max_len}; scanning with window={room} instead",
                          RuntimeWarning, stacklevel=3)
        elif size >= room * CLAMP_WARN_RATIO:
            warnings.warn(f"laya: predict_long: these questions leave only {room} of max_len={max_len} for the "
                          f"state, so the window is capped {size} -> {room} and about {size / room:.1f}x as many "
                          "windows are read", RuntimeWarning, stacklevel=3)
        size = room
    stride = scan.stride if scan.stride is not None and scan.stride > 0 else None
    step = stride if stride is not None else max(1, size // 2)
    if step > size:
        if size < requested and stride is not None and stride <= requested:
            warnings.warn(f"laya: predict_long: stride={step} suited the window={requested} asked for, but the "
                          f"window was reduced to {size}; scanning with stride={max(1, size // 2)} instead",
                          RuntimeWarning, stacklevel=3)
            step = max(1, size // 2)
        else:
            raise QuestionError(
                f"predict_long: stride={step} steps past the {size}-token window"
                f"{' these questions leave room for' if size < requested else ''}, so {step - size} tokens "
                f"between every pair of windows would be read by no window at all; pass stride <= {size}",
                error_type="invalid_scan")
    return size, step, room


def cut(n_tokens: int, size: int, step: int, room: int, explicit: bool) -> Windows:
    """The windows of a state of `n_tokens` tokens (none when one pass reads it whole)."""
    if n_tokens <= (size if explicit else room):
        return Windows(size, step, n_tokens)
    starts, i = [], 0
    while i < n_tokens:
        starts.append(i)
        if i + size >= n_tokens:
            break
        i += step
    return Windows(size, step, n_tokens, tuple(starts))


def _key(value: Any) -> float:
    return round(float(value), 4)


def aggregate(windows: Windows, responses: list[SystemOneResponse]) -> SystemOneResponse:
    """One response from the responses of a state's windows (in order)."""
    if not windows.starts:
        out = responses[0]
        if out.x_usage is not None:
            out.x_usage["windows"] = 1
        return out
    answers = {}
    for qid, first in responses[0].answers.items():
        per = [r.answers[qid] for r in responses]
        if first.qtype == "noul":
            best = max(range(len(per)), key=lambda j: _key(per[j].value))
        else:
            best = max(range(len(per)), key=lambda j: _key(per[j].answer_confidence or 0.0))
        answer = per[best]
        start = windows.starts[best]
        answer.extras["x_window"] = {"index": best, "token_start": start,
                                     "token_end": min(start + windows.size, windows.n_tokens),
                                     "count": len(per)}
        answers[qid] = answer
    usage = merged_usage(windows, [r.x_usage or {} for r in responses], list(answers))
    return SystemOneResponse(model=responses[0].model, answers=answers,
                             input_tokens=sum(r.input_tokens for r in responses), x_usage=usage,
                             precision=responses[0].precision)


def merged_usage(windows: Windows, usages: list[dict[str, Any]], qids: list[str]) -> dict[str, Any]:
    """One state's `x_usage` from its windows' (in order): counts summed, the state's own tokens
    counted once, the questions truncated in any window (in `qids` order). A plan reports the same."""
    usage: dict[str, Any] = {}
    for one in usages:
        for key, value in one.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            usage[key] = usage.get(key, 0) + value
    truncated = {q for one in usages for q in one.get("truncated_questions", [])}
    usage["truncated_questions"] = [qid for qid in qids if qid in truncated]
    usage["state_tokens"] = windows.n_tokens
    usage["windows"] = len(usages)
    return usage
