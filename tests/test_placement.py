"""Where a forward pass's threads run (laya.native.placement): one core each when the pool
takes every core, nothing pinned otherwise, the calling thread pinned only for its call."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading

import pytest
from conftest import need

from laya.native import placement
from laya.native.placement import Placement, plan
from laya.request import Request

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="thread affinity (os.sched_getaffinity) is Linux's")


def machine(monkeypatch, cpus: list[int], core_of: dict[int, tuple[str, str]] | None = None) -> None:
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(cpus))
    monkeypatch.setattr(placement, "_core_of", lambda cpu: (core_of or {})[cpu] if core_of else ("0", str(cpu)))


def test_a_pool_as_large_as_the_cores_gets_a_core_per_thread(monkeypatch):
    machine(monkeypatch, [0, 1])
    assert plan(None) == Placement(caller=0, pool=(1,))
    assert plan(2) == Placement(caller=0, pool=(1,))
    assert plan(2).affinities() == "2"  # ONNX Runtime counts processors from 1


def test_one_logical_processor_per_physical_core_of_the_allowed_set(monkeypatch):
    # 8 logical processors, hyperthreads 0/4, 1/5, 2/6, 3/7; the process may use 1, 2, 5, 6 only
    machine(monkeypatch, [1, 2, 5, 6], {1: ("0", "1"), 2: ("0", "2"), 5: ("0", "1"), 6: ("0", "2")})
    chosen = plan(None)
    assert chosen == Placement(caller=1, pool=(2,))
    assert chosen.threads == 2


def test_nothing_is_pinned_when_the_pool_leaves_cores_free_or_there_is_one_core(monkeypatch):
    machine(monkeypatch, [0, 1, 2, 3])
    assert plan(2) is None and plan(1) is None and plan(8) is None
    assert plan(4) == Placement(caller=0, pool=(1, 2, 3))
    machine(monkeypatch, [3])
    assert plan(None) is None


def test_the_caller_is_pinned_for_its_call_only_and_a_second_caller_is_not():
    allowed = os.sched_getaffinity(0)
    target = min(allowed)
    place = Placement(caller=target, pool=())
    seen: dict[str, set[int]] = {}
    inside, release = threading.Event(), threading.Event()

    def first() -> None:
        with place.pinned():
            seen["first"] = os.sched_getaffinity(0)
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with place.pinned():  # while the first call runs: not pinned onto its core
        seen["second"] = os.sched_getaffinity(0)
    release.set()
    thread.join(10)
    assert seen["first"] == {target}
    assert seen["second"] == allowed
    assert os.sched_getaffinity(0) == allowed  # this thread free again
    with place.pinned():
        assert os.sched_getaffinity(0) == {target}
    assert os.sched_getaffinity(0) == allowed


def test_a_dedicated_thread_stays_pinned_and_a_second_caller_meanwhile_is_not(monkeypatch):
    monkeypatch.setattr(placement, "_dedicated", None)
    allowed = os.sched_getaffinity(0)
    target = min(allowed)
    place = Placement(caller=target, pool=())
    seen: dict[str, set[int]] = {}

    def engine_thread() -> None:  # as the engine process's main thread: dedicated, then one call after another
        placement.dedicate_this_thread()
        seen["before"] = os.sched_getaffinity(0)
        with place.pinned():
            seen["first"] = os.sched_getaffinity(0)
        seen["between"] = os.sched_getaffinity(0)
        with place.pinned():
            seen["second"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=engine_thread)
    thread.start()
    thread.join(10)
    assert seen["before"] == allowed
    assert seen["first"] == seen["between"] == seen["second"] == {target}
    with place.pinned():  # another thread, while the dedicated one holds the core: left where it is
        assert os.sched_getaffinity(0) == allowed
    assert os.sched_getaffinity(0) == allowed


def test_the_engine_process_keeps_its_forward_thread_on_one_core(checkpoint_dir):
    need("onnxruntime")
    from laya.server.remote import RemoteEngine
    from laya.server.serve import ModelSpec, ServeOptions, load_engine

    cores = placement.one_per_core()
    # one core: nothing is pinned, and the process keeps the CPU set it was given
    expected = {cores[0]} if len(cores) >= 2 else os.sched_getaffinity(0)
    remote = RemoteEngine(functools.partial(load_engine, ModelSpec(str(checkpoint_dir), name="enc"),
                                            ServeOptions(runtime="onnx", threads=len(cores))))
    loop = asyncio.new_event_loop()
    try:
        remote.serve_on(loop)
        for _ in range(2):
            job = remote.prepare(Request.of(["The server is down."],
                                            {"u": {"type": "noul", "instructions": "Is it urgent?"}}))
            (answer,), _ = loop.run_until_complete(remote.submit(job))
            assert 0.0 <= answer.answers["u"].value <= 1.0
            assert os.sched_getaffinity(remote.pid) == expected  # its main thread, pinned by the warm-up
    finally:
        remote.close()
        loop.close()


def test_the_onnx_runtime_pins_its_pool_when_it_takes_every_core(monkeypatch, tmp_path):
    need("onnxruntime")
    import laya
    from laya.testing.checkpoints import TestCheckpointSpec, write_test_checkpoint

    folder = write_test_checkpoint(tmp_path / "ckpt", TestCheckpointSpec())
    cores = placement.one_per_core()
    alone = laya.load(str(folder), runtime="onnx", threads=1)
    threads_before = set(os.listdir("/proc/self/task"))
    full = laya.load(str(folder), runtime="onnx", threads=len(cores))
    if len(cores) >= 2:
        assert full.runtime.placement == Placement(caller=cores[0], pool=tuple(cores[1:]))
        # the session's pool threads, started with it, each on a core of the pool's
        started = set(os.listdir("/proc/self/task")) - threads_before
        pinned = {frozenset(os.sched_getaffinity(int(tid))) for tid in started}
        assert {frozenset({cpu}) for cpu in cores[1:]} <= pinned, pinned
    assert alone.runtime.placement is None
    before = os.sched_getaffinity(0)
    questions = {"u": {"type": "noul", "instructions": "Is it urgent?"}}
    pinned = full.predict("The server is down.", questions)["answers"]["u"]
    assert os.sched_getaffinity(0) == before  # the caller is free again after the call
    free = alone.predict("The server is down.", questions)["answers"]["u"]
    assert abs(pinned["noul"] - free["noul"]) < 1e-5  # P(yes), whichever threads computed it
