"""`laya predict -i in.jsonl -o out.jsonl`: many requests, one per line, answered in order.

A line is a System One request body (`{"id"?, "state", "questions"?, "model"?, "tournament"?,
"x_overflow"?, "x_order"?, "x_min_confidence"?, ...}`: docs/request-options.md) or a bare JSON string
(a state); `--questions` gives the lines that have none one shared set. Every line gets exactly one
output line, in input order: `{"id", "line", "response"}` or, for a line that cannot be answered,
`{"id", "line", "error": {"status", "type", "message"}}` naming the problem, while the run goes on.
The id is the line's own `id`, else its line number; ids already in the output are skipped, so a run
that was stopped resumes where it stopped (a torn last line, from a kill mid-write, is cut off first).

Lines are answered either here, by an engine (the encoder's coalesce their rows into shared forward
passes, `CHUNK` lines at a time), or by a running `laya serve` (`--url`: no model load, at most
`concurrency` requests in flight, `Retry-After` honoured on 429 and 503).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from laya.api import STRICT_HEADER, ApiError, error_body
from laya.apps.outbound import bearer, check_key_transport, request
from laya.errors import LayaError, QuestionError
from laya.limits import Limits
from laya.request import check_strict, parse_request
from laya.structured.gate import apply_gate

MAX_LINE_BYTES = 8 * 1024 * 1024  # the server's default body bound
MAX_ID_CHARS = 200
CHUNK = 32  # lines whose rows one engine call shares
MAX_ERROR_CHARS = 1000
RETRIES = 8  # attempts of one line against a server that sheds (429) or is restarting (503)
MAX_RETRY_AFTER_S = 60.0


@dataclass
class Line:
    number: int  # 1-based, in the input file
    id: Any
    body: dict[str, Any] | None  # None when the line could not be read as a request
    error: dict[str, Any] | None = None


@dataclass
class Tally:
    answered: int = 0
    failed: int = 0
    skipped: int = 0  # already in the output (resumed)


def failure(status: int, kind: str, message: str) -> dict[str, Any]:
    return {"status": status, "type": kind, "message": message[:MAX_ERROR_CHARS]}


def api_failure(exc: ApiError) -> dict[str, Any]:
    """An `ApiError` (the server's 4xx) as one bounded error object."""
    body = error_body(exc.detail).get("detail")
    if isinstance(body, list):
        message = "; ".join(f"{'.'.join(str(p) for p in item.get('loc', ()))}: {item.get('msg', '')}"
                            for item in body)
        return failure(exc.status, "invalid_request", message)
    if isinstance(body, dict):
        return failure(exc.status, str(body.get("error_type", "invalid_request")), str(body.get("message", body)))
    return failure(exc.status, "invalid_request", str(body))


def read_lines(path: Path, questions: Mapping[str, Any] | None) -> Iterator[Line]:
    """The input's lines as requests; blank lines are skipped (they are not requests), a line over
    `MAX_LINE_BYTES` is an error without being held in memory whole."""
    with open(path, "rb") as handle:
        number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                    pass
                yield Line(number, number, None, failure(413, "line_too_long",
                                                         f"line {number} is longer than {MAX_LINE_BYTES} bytes"))
                continue
            if not raw.strip():
                continue
            yield parse_line(number, raw, questions)


def parse_line(number: int, raw: bytes, questions: Mapping[str, Any] | None) -> Line:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return Line(number, number, None, failure(400, "invalid_json", f"line {number} is not JSON: {exc}"))
    if isinstance(data, str):
        data = {"state": data}
    if not isinstance(data, dict):
        return Line(number, number, None, failure(422, "invalid_request", f"line {number} is a "
                                                  f"{type(data).__name__}; a line is a request object or a state"))
    ident = data.pop("id", number)
    if isinstance(ident, bool) or not isinstance(ident, str | int) or len(str(ident)) > MAX_ID_CHARS:
        return Line(number, number, None, failure(422, "invalid_id", f"line {number}: id must be a string or an "
                                                  f"integer of at most {MAX_ID_CHARS} characters"))
    if "questions" not in data and questions is not None:
        data["questions"] = questions
    return Line(number, ident, data)


def answered_ids(out: Path) -> tuple[set[str], set[int]]:
    """The ids the output already holds, and its line numbers (for the repeats of an id, which are
    errors of their own); a torn last line (a kill mid-write) is cut off so the run appends after
    the last whole one."""
    if not out.exists():
        return set(), set()
    with open(out, "rb+") as handle:
        data = handle.read()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            handle.truncate(end)
    ids, numbers = set(), set()
    for raw in data[:end].splitlines():
        try:
            record = json.loads(raw)
            ids.add(_key(record["id"]))
            numbers.add(int(record["line"]))
        except (ValueError, KeyError, TypeError):
            continue
    return ids, numbers


def outcomes(path: Path) -> dict[str, dict[str, Any]]:
    """The output lines of a run whose ids are strings, by id (a torn last line is left out: it is
    asked again)."""
    if not path.is_file():
        return {}
    out = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and isinstance(line.get("id"), str):
            out[line["id"]] = line
    return out


def _key(ident: Any) -> str:
    return json.dumps(ident)


class Progress:
    """Lines done of the total, the rate and the time left, on stderr: redrawn in place on a
    terminal, a line every few seconds otherwise."""

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool = True,
                 note: Callable[[], str] | None = None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.note = note  # more to show after the counts (what the lines cost so far)
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self.last = time.monotonic()

    def step(self, failed: bool) -> None:
        self.done += 1
        self.failed += int(failed)
        now = time.monotonic()
        if now - self.last >= (0.25 if self.tty else 5.0):
            self.last = now
            self.show(final=False)

    def show(self, final: bool) -> None:
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        text = (f"{self.done}/{self.total} lines  {rate:.1f} lines/s  "
                + (f"{elapsed:.1f} s" if final else f"ETA {int(left) // 60}:{int(left) % 60:02d}")
                + (f"  {self.failed} failed" if self.failed else "") + (f"  {self.note()}" if self.note else ""))
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def count_lines(path: Path) -> int:
    with open(path, "rb") as handle:
        return sum(1 for raw in iter(lambda: handle.readline(1 << 20), b"") if raw.strip() and raw.endswith(b"\n")
                   ) + (1 if _last_unterminated(path) else 0)


def _last_unterminated(path: Path) -> bool:
    size = path.stat().st_size
    if size == 0:
        return False
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) != b"\n"


Answer = Callable[[list[Line]], list[dict[str, Any]]]  # lines -> per line {"response"} or {"error"}


def run(lines: Iterator[Line], out: Path, answer: Answer, *, total: int, chunk: int = CHUNK,
        progress: bool = True, stream: IO[str] | None = None, note: Callable[[], str] | None = None) -> Tally:
    """Every line not yet in `out` answered by `answer`, chunk by chunk, appended in input order."""
    done, done_lines = answered_ids(out)
    tally = Tally()
    bar = Progress(total, stream, progress, note)
    seen: dict[str, int] = {}
    with open(out, "a", encoding="utf-8") as sink:
        pending: list[Line] = []

        def flush() -> None:
            for line, outcome in zip(pending, answer(pending) if pending else []):
                write(sink, line, outcome, tally, bar)
            pending.clear()

        for line in lines:
            key = _key(line.id)
            repeat = key in seen
            if (line.number in done_lines) if repeat else (key in done):
                tally.skipped += 1
                bar.total -= 1
                seen.setdefault(key, line.number)
                continue
            if repeat:
                line = Line(line.number, line.id, None, failure(422, "duplicate_id", f"line {line.number}: id "
                                                                f"{str(line.id)[:80]!r} repeats line {seen[key]}"))
            else:
                seen[key] = line.number
            pending.append(line)
            if len(pending) >= chunk:
                flush()
        flush()
    bar.show(final=True)
    return tally


def write(sink: IO[str], line: Line, outcome: dict[str, Any], tally: Tally, bar: Progress) -> None:
    failed = "error" in outcome
    record = {"id": line.id, "line": line.number, **outcome}
    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    sink.flush()
    tally.failed += int(failed)
    tally.answered += int(not failed)
    bar.step(failed)


# --- answered here ---------------------------------------------------------------------------------


def local_answer(engine: Any, limits: Limits | None = None, strict: bool = False) -> Answer:
    """Lines answered by an engine in this process: each validated and prepared alone (a bad line
    is its own error), the good ones of a chunk run in one `execute`; each answer marked against its
    line's `x_min_confidence`, and with the contract's fields only when `strict` (`--strict`)."""
    limits = limits or Limits()

    def answer(lines: list[Line]) -> list[dict[str, Any]]:
        outcomes: list[dict[str, Any] | None] = [None] * len(lines)
        jobs, where, gates = [], [], []
        for i, line in enumerate(lines):
            if line.error is not None:
                outcomes[i] = {"error": line.error}
                continue
            try:
                req = parse_request(line.body, limits=limits)
                if req.model not in (None, engine.info.name):
                    raise QuestionError(f"this run answers with {engine.info.name!r}, not {req.model!r}",
                                        error_type="unknown_model")
                check_strict(req.min_confidence, strict)
                jobs.append(engine.prepare(req, limits=limits))
                where.append(i)
                gates.append(req.min_confidence)
            except ApiError as exc:
                outcomes[i] = {"error": api_failure(exc)}
            except (QuestionError, LayaError) as exc:
                outcomes[i] = {"error": failure(422, getattr(exc, "error_type", "invalid_request"), str(exc))}
        for i, gate, results in zip(where, gates, _execute(engine, jobs, strict)):
            if "response" in results:
                apply_gate([results["response"]], gate)
            outcomes[i] = results
        return outcomes  # type: ignore[return-value]

    return answer


def _execute(engine: Any, jobs: list[Any], strict: bool = False) -> list[dict[str, Any]]:
    if not jobs:
        return []
    try:
        return [_response(engine, results, strict) for results in engine.execute(jobs)]
    except (QuestionError, LayaError):
        if len(jobs) == 1:
            raise
    out = []
    for job in jobs:  # one job's failure must not take the chunk's others with it
        try:
            out.append(_response(engine, engine.execute([job])[0], strict))
        except (QuestionError, LayaError) as exc:
            out.append({"error": failure(422, getattr(exc, "error_type", "invalid_request"), str(exc))})
    return out


def _response(engine: Any, results: list[Any], strict: bool = False) -> dict[str, Any]:
    (result,) = results
    result.model = engine.info.name
    return {"response": result.to_json(strict)}


# --- answered by a running server --------------------------------------------------------------------


def remote_answer(url: str, api_key: str | None, concurrency: int = 4, timeout_s: float = 120.0,
                  sleep: Callable[[float], None] = time.sleep, timed: bool = False, rate: float | None = None,
                  strict: bool = False) -> Answer:
    """Lines sent to a running `laya serve` (`/v1/systemone`), at most `concurrency` at once; a
    429 or 503 is retried after its `Retry-After`, a 4xx is the line's error as the server words it.
    `timed`: an answer also gives the milliseconds of the request that answered it (`ms`). `rate`:
    at most that many requests a second (retries included). `strict`: asked of the server
    (`X-Laya-Strict: 1`)."""
    import httpx

    if concurrency < 1:
        raise LayaError(f"--concurrency must be at least 1, got {concurrency}")
    check_key_transport(url, api_key, url)
    headers = {**bearer(api_key), **({STRICT_HEADER: "1"} if strict else {})}
    client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="laya-jsonl")
    lock = threading.Lock()
    unreachable: list[str] = []
    if rate is not None and not rate > 0:
        raise LayaError(f"the request rate must be a positive number per second, got {rate}")
    slot = [time.monotonic()]

    def paced() -> None:
        """Wait for this request's turn under `rate`."""
        if rate is None:
            return
        with lock:
            turn = max(slot[0], time.monotonic())
            slot[0] = turn + 1.0 / rate
        if (wait := turn - time.monotonic()) > 0:
            sleep(wait)

    def one(line: Line) -> dict[str, Any]:
        if line.error is not None:
            return {"error": line.error}
        for attempt in range(RETRIES):
            with lock:
                if unreachable:
                    return {"error": failure(503, "unreachable", unreachable[0])}
            paced()
            started = time.perf_counter()
            try:
                r = request(client, "POST", "/v1/systemone", json=line.body)
            except LayaError as exc:  # an answer over the cap
                return {"error": failure(502, "bad_gateway", str(exc))}
            except httpx.HTTPError as exc:
                if attempt == RETRIES - 1:
                    with lock:
                        unreachable.append(f"{url} cannot be reached: {exc}")
                    return {"error": failure(503, "unreachable", f"{url} cannot be reached: {exc}")}
                sleep(min(2.0 ** attempt * 0.25, MAX_RETRY_AFTER_S))
                continue
            if r.status_code == 200:
                try:
                    response = r.json()
                except ValueError:
                    return {"error": failure(502, "bad_gateway", f"{url} answered 200 with a body that is not JSON")}
                return {"response": response, **({"ms": (time.perf_counter() - started) * 1000.0} if timed else {})}
            if r.status_code in (429, 503) and attempt < RETRIES - 1:
                sleep(_retry_after(r.headers.get("retry-after"), attempt))
                continue
            return {"error": server_failure(r)}
        return {"error": failure(503, "overloaded", "the server kept shedding this line")}

    def answer(lines: list[Line]) -> list[dict[str, Any]]:
        futures: list[Future] = [pool.submit(one, line) for line in lines]
        return [f.result() for f in futures]

    def close() -> None:
        pool.shutdown(wait=True)
        client.close()

    answer.close = close  # type: ignore[attr-defined]
    return answer


def _retry_after(raw: str | None, attempt: int) -> float:
    try:
        value = float(raw) if raw is not None else 2.0 ** attempt * 0.25
    except ValueError:
        value = 1.0
    return min(max(value, 0.0), MAX_RETRY_AFTER_S)


def server_failure(r: Any) -> dict[str, Any]:
    """A running server's 4xx or 5xx answer (an httpx response) as one bounded error object."""
    try:
        body = r.json()
    except ValueError:
        return failure(r.status_code, "server_error", r.text[:MAX_ERROR_CHARS])
    return api_failure(ApiError(r.status_code, body.get("detail", body) if isinstance(body, dict) else body))

