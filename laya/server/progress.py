"""Whether an engine process is making progress, told from outside it without a message.

Wall time says nothing about it: on a machine shared with a build or a test run every forward pass
takes longer, and an engine that is working slowly must not be killed for it (a restart under the
same load is slower still, and every request meanwhile gets a 503). So the supervisor reads what
the process itself spends:

- the CPU time it consumes (user and system, all its threads), read by the kernel's accounting: a
  process stopped (SIGSTOP), deadlocked, or stuck waiting in a native call consumes none, however
  long it is given; a slow one consumes it slowly;
- what it writes, where it runs batches, on a small shared board (`WorkBoard`): the units of work of the
  batch it runs now (tokens where its engine counts them ahead, an encoder's or a prefill's; else
  rows or decisions), the CPU time when that batch began, and the most CPU time a unit took lately.
  So a process spinning in a native loop (it consumes CPU, answers nothing) is told by the CPU it has
  spent on a batch against what the batch's units need, a bound in the work's own units that a busy
  machine does not stretch.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

UNITS, BEGAN_CPU, PER_UNIT = 0, 1, 2  # the board's slots
BOARD_SLOTS = 3
DEFAULT_PER_UNIT_S = 0.01  # CPU seconds a unit is allowed before the process has measured one
SLOW_WINDOW_S = 5.0  # seconds of work over which the CPU share a busy process gets is judged
SLOW_SHARE = 0.5  # under this share of one core while working, the machine is busy: said in /health

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds process `pid` has consumed so far (all threads), or None where this platform
    does not let another process read them (then the supervisor falls back to wall time)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    fields = data.rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime, the 14th and 15th fields


def work_units(job: Any) -> int:
    """A job's work in its engine's own units: the tokens its rows read where the engine counts them
    ahead (an encoder's), a chat model's prompt tokens (what its prefill reads), else its rows."""
    tokens = int(getattr(job, "n_tokens", 0) or 0)
    if tokens:
        return tokens
    if (parts := getattr(job, "parts", None)) is not None:  # one job per order (laya.orders)
        return sum(work_units(part) for part in parts) or max(1, job.n_rows)
    if (planned := getattr(job, "planned", None)) is not None:  # a decide engine's prompts
        tokens = sum(len(prompt.tokens) for per_state in planned for p in per_state for prompt in p.prompts)
    return tokens or max(1, int(job.n_rows))


class WorkBoard:
    """The engine process's side of the board: it writes the units and CPU time of each batch it runs
    (a few float stores a batch, nothing sent)."""

    def __init__(self, board: Any, keep: int = 64):
        self.board = board
        self.per_unit: deque[float] = deque(maxlen=keep)

    def begin(self, jobs: Iterable[Any]) -> tuple[int, float]:
        units = sum(work_units(job) for job in jobs)
        began = time.process_time()
        self.board[BEGAN_CPU] = began
        self.board[UNITS] = units
        return units, began

    def end(self, units: int, began: float) -> None:
        self.board[UNITS] = 0
        if units:
            self.per_unit.append((time.process_time() - began) / units)
            self.board[PER_UNIT] = max(self.per_unit)


@dataclass(frozen=True)
class Bounds:
    """When an engine process with work counts as hung (from `RestartPolicy`)."""

    stall_s: float  # seconds with work outstanding, no reply and no CPU consumed
    min_cpu_s: float  # CPU seconds a batch may spend without answering, whatever its size
    factor: float  # times what the batch's units need at the process's measured speed


@dataclass
class Verdict:
    kind: str  # "stalled" (no progress at all: killed) or "spinning" (CPU spent past the work's bound)
    why: str


class Watch:
    """What the supervisor has seen of one engine process: when it last made progress, and the CPU
    share it got while working (a busy machine's sign, said in /health)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.cpu = cpu_seconds(pid)
        self.moved_at = self.looked = time.monotonic()
        self.busy_wall = self.busy_cpu = 0.0
        self.share: float | None = None  # the CPU share (of one core) it got while working, last judged

    @property
    def readable(self) -> bool:
        """Whether its CPU time can be read here (else the supervisor judges by wall time)."""
        return self.cpu is not None

    def look(self, busy: bool, heard: float, board: Any, bounds: Bounds) -> Verdict | None:
        """Read its CPU time now; a verdict if it is hung. `heard` is when it last replied, or was given
        work while idle (monotonic): silence counts from then at the earliest."""
        now, cpu = time.monotonic(), cpu_seconds(self.pid)
        wall, self.looked = now - self.looked, now
        before, self.cpu = self.cpu, cpu
        self.moved_at = max(self.moved_at, heard)
        if cpu is None or before is None or not busy:
            self.busy_wall = self.busy_cpu = 0.0
            return None
        if cpu > before:
            self.moved_at = now
        self.busy_wall += wall
        self.busy_cpu += cpu - before
        if self.busy_wall >= SLOW_WINDOW_S:
            self.share = self.busy_cpu / self.busy_wall
            self.busy_wall = self.busy_cpu = 0.0
        if now - self.moved_at > bounds.stall_s:
            return Verdict("stalled", f"it consumed no CPU and answered nothing for {now - self.moved_at:.1f} s "
                                      "with work outstanding")
        units = int(board[UNITS])
        if units:
            spent = cpu - float(board[BEGAN_CPU])
            per_unit = float(board[PER_UNIT]) or DEFAULT_PER_UNIT_S
            bound = max(bounds.min_cpu_s, bounds.factor * units * per_unit)
            if spent > bound:
                return Verdict("spinning", f"it spent {spent:.1f} CPU s on a batch of {units} units without "
                                           f"answering, over the {bound:.1f} s its measured speed allows")
        return None
