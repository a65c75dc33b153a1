"""Where a forward pass's threads run: one core each, when the forward takes every core there is.

Why: a forward on a pool of N threads waits, at the end of every operator, for the slowest of them.
When the scheduler wakes a pool thread onto the core the calling thread is on (as it does after the
pool slept, e.g. between two requests), the two take turns on that core until the load balancer
moves one, and every operator meanwhile waits a time slice: measured on a 2-core Xeon
(`benchmarks/overhead.py`), the first forwards after other processes had run took 8-11 ms against
3.6 ms (a p99 of 10.7 ms against a median of 3.6), and with the two threads on a core each the p99
was 4.7-5.4 ms. So when the pool is as large as the cores this process may use, each of its threads
is pinned to a core of its own (the runtime's pool threads by the runtime, the calling thread here
for the length of the call), one logical processor per physical core.

When the pool is smaller than the machine, nothing is pinned: the scheduler's freedom to place the
threads around other work is worth more there. Framework-free: the runtimes apply it.

A thread that does nothing but run forward passes (the engine process's main thread, which
`dedicate_this_thread` names) keeps its core once pinned: pinning and freeing it around every call
costs three system calls, 0.02-0.03 ms a call where the code runs cold after a pause (2-core Xeon).
Any other caller (a library user's thread) is freed after each call, as its other work should not be
held to one core.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_dedicated: int | None = None  # the thread (`threading.get_ident()`) that runs nothing but forward passes


def dedicate_this_thread() -> None:
    """Name the calling thread as one that runs forward passes and nothing that another core would
    serve better, for the life of the process: once a forward pass pins it, it stays pinned."""
    global _dedicated
    _dedicated = threading.get_ident()


def _core_of(cpu: int) -> tuple[str, str]:
    """(package, core) of logical processor `cpu`, or the processor itself where sysfs says nothing."""
    topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
    except OSError:
        return ("?", str(cpu))


def one_per_core() -> list[int]:
    """The logical processors this process may use, the first of each physical core, in order."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    seen: dict[tuple[str, str], int] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        seen.setdefault(_core_of(cpu), cpu)
    return list(seen.values())


@dataclass
class Placement:
    """The calling thread's core and the pool threads' cores (logical processor numbers)."""

    caller: int
    pool: tuple[int, ...]
    _busy: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _held: int | None = field(default=None, repr=False, compare=False)  # a dedicated thread pinned for good

    @property
    def threads(self) -> int:
        return 1 + len(self.pool)

    def affinities(self) -> str:
        """The pool threads' cores as ONNX Runtime's `session.intra_op_thread_affinities` reads them
        (1-based processor numbers, one thread after another)."""
        return ";".join(str(cpu + 1) for cpu in self.pool)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """The calling thread on its own core for the length of the block, then free again (a dedicated
        thread stays pinned). A second thread calling at the same time runs unpinned (pinned, it would
        share the first one's core)."""
        me = threading.get_ident()
        if me == self._held:
            yield
            return
        if not self._busy.acquire(blocking=False):
            yield
            return
        try:
            before = os.sched_getaffinity(0)
            try:
                os.sched_setaffinity(0, (self.caller,))
            except OSError:  # the process's CPU set changed since the plan: run where we are
                yield
                return
            if me == _dedicated:
                self._held = me  # its core for good; the lock stays taken, as a second caller must not share it
                yield
                return
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, before)
        finally:
            if self._held != me:
                self._busy.release()


def plan(threads: int | None) -> Placement | None:
    """A placement for a pool of `threads` (None: one per core), or None when it would not take every
    core this process may use (or the platform cannot pin threads)."""
    cores = one_per_core()
    wanted = threads or len(cores)
    if len(cores) < 2 or wanted != len(cores):
        return None
    return Placement(caller=cores[0], pool=tuple(cores[1:]))
