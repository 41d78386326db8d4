"""cptest/probe/runtime.py: the switch, the rank file, error containment."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from cptest.evidence import ProbeNote, RankId, read_records
from cptest.probe import runtime
from cptest.probe.runtime import BatchRecorder, Probe, Record


def test_probe_is_off_without_the_directory_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.ENV_DIR, raising=False)
    runtime.set_probe(None)
    assert runtime.get_probe() is None
    assert not runtime.enabled({runtime.ENV_DIR: "  "})


def test_probe_is_on_with_the_directory_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path))
    runtime.set_probe(None)
    try:
        p = runtime.get_probe()
        assert p is not None and p.out_dir == tmp_path and runtime.get_probe() is p
    finally:
        runtime.set_probe(None)


@pytest.mark.parametrize(("env", "attribute", "cases"), [
    (runtime.ENV_COPY_WITHIN_S, "copy_within_s",
     (("0.15", 0.15), ("soon", runtime.COPY_WITHIN_S), ("-1", runtime.COPY_WITHIN_S),
      ("inf", runtime.COPY_WITHIN_S), ("", runtime.COPY_WITHIN_S))),
    (runtime.ENV_COPY_EVERY, "copy_every",
     (("1024", 1024), ("many", runtime.COPY_EVERY), ("0", runtime.COPY_EVERY),
      ("-4", runtime.COPY_EVERY), ("2.5", runtime.COPY_EVERY), ("", runtime.COPY_EVERY))),
])
def test_the_probe_takes_its_copy_bounds_from_the_environment_and_ignores_a_bad_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str, attribute: str,
        cases: tuple[tuple[str, float], ...]) -> None:
    monkeypatch.setenv(runtime.ENV_DIR, str(tmp_path))
    for text, bound in cases:
        monkeypatch.setenv(env, text)
        runtime.set_probe(None)
        try:
            p = runtime.get_probe()
            assert p is not None and getattr(p, attribute) == bound, text
        finally:
            runtime.set_probe(None)


def test_records_before_the_rank_is_known_go_to_the_rank_file_once_it_is(tmp_path: Path) -> None:
    p = Probe(tmp_path, clock=lambda: 10.0)
    p.note("early")
    assert list(tmp_path.iterdir()) == []
    p.set_rank(RankId(world=3))
    p.note("late")
    assert p.flush()
    recs, dropped = read_records(tmp_path / "rank3.jsonl")
    assert dropped == 0
    assert [r.message for r in recs if isinstance(r, ProbeNote)] == ["early", "late"]
    assert all(r.rank == RankId(world=3) for r in recs if isinstance(r, ProbeNote))


def test_each_record_reaches_the_disk_as_it_is_written(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    p.note("one")
    # read through a separate descriptor, as a reader would after a SIGKILL
    assert (tmp_path / "rank0.jsonl").read_text().count("\n") == 1
    p.close()


def test_a_raising_hook_becomes_an_error_note_and_returns_none(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))

    @p.guarded("boom")
    def hook(x: int) -> int:
        raise ValueError(f"bad {x}")

    assert hook(7) is None
    assert p.flush()
    recs, _ = read_records(tmp_path / "rank0.jsonl")
    notes = [(r.level, r.message) for r in recs if isinstance(r, ProbeNote)]
    assert notes == [("error", "boom: ValueError: bad 7")]


def test_a_hook_that_keeps_raising_is_written_at_most_five_times(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    hook = p.guarded("again")(lambda: 1 / 0)
    for _ in range(20):
        hook()
    assert p.flush()
    recs, _ = read_records(tmp_path / "rank0.jsonl")
    assert len(recs) == runtime.MAX_ERRORS_PER_HOOK and p.errors["again"] == 20
    assert "not written" in recs[-1].message  # type: ignore[union-attr]


def test_a_process_that_never_learns_its_rank_leaves_its_warnings_in_a_pid_file(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.note("hook target x not found", "warning")
    p.flush_held_at_exit()
    recs, _ = read_records(tmp_path / f"pid{os.getpid()}.jsonl")
    assert len(recs) == 1


def test_a_process_with_only_info_notes_and_no_rank_writes_nothing(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.note("hello")
    p.flush_held_at_exit()
    assert list(tmp_path.iterdir()) == []


class Job:
    def __init__(self, p: Probe, message: str, done: threading.Event | None = None) -> None:
        self.p, self.message, self.done = p, message, done

    def ready(self) -> bool:
        return self.done is None or self.done.is_set()

    def run(self) -> None:
        self.p.note(self.message)


def test_deferred_work_and_writes_keep_their_order_and_close_finishes_them(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    p.note("before")
    copied = threading.Event()
    p.defer(Job(p, "deferred", copied))
    p.note("after")  # queued behind the deferred work, not written ahead of it
    p.run_ready()  # the engine's next step: the copy is not done, nothing is waited for
    assert not p.flush(timeout=0.05)  # writes what it can, and says the rest is still pending
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == ["before"]  # type: ignore[union-attr]
    copied.set()
    p.run_ready()
    assert p.flush(timeout=0.0)  # nothing was left pending for it
    msgs = [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]]  # type: ignore[union-attr]
    assert msgs == ["before", "deferred", "after"]
    p.defer(Job(p, "last"))
    p.close()
    assert read_records(tmp_path / "rank0.jsonl")[0][-1].message == "last"  # type: ignore[union-attr]


def test_work_a_stalled_engine_leaves_pending_is_finished_by_the_watchdog(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    p.defer(Job(p, "left behind"))  # no step and no chores come after it
    deadline = time.monotonic() + 5.0
    path = tmp_path / "rank0.jsonl"
    # The file may exist before the line is in it: wait for the record itself.
    while not (path.exists() and read_records(path)[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [r.message for r in read_records(path)[0]] == ["left behind"]  # type: ignore[union-attr]
    p.close()


def test_failing_deferred_work_does_not_stop_the_probe(tmp_path: Path) -> None:
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))

    class Broken(Job):
        def run(self) -> None:
            raise RuntimeError("unguarded")

    p.defer(Broken(p, ""))
    p.note("still writing")
    assert p.flush(timeout=10.0)
    recs, _ = read_records(tmp_path / "rank0.jsonl")
    assert [r.message for r in recs] == ["still writing"]  # type: ignore[union-attr]
    p.close()


def test_graph_counts_are_written_while_the_engine_is_idle(tmp_path: Path) -> None:
    p = Probe(tmp_path, graph_flush_s=0.05)
    p.set_rank(RankId(world=0))
    for _ in range(3):
        p.count_graph("replay", "decode")
    path = tmp_path / "rank0.jsonl"
    deadline = time.monotonic() + 5.0  # no step, no flush: the watchdog writes the counts
    while not (path.exists() and read_records(path)[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    recs, _ = read_records(path)
    assert [(r.event, r.phase, r.count) for r in recs] == [("replay", "decode", 3)]  # type: ignore[union-attr]
    p.count_graph("eager", "prefill")
    p.close()  # a final flush writes what was counted since, due or not
    recs, _ = read_records(tmp_path / "rank0.jsonl")
    assert sum(r.count for r in recs if r.event == "eager") == 1  # type: ignore[union-attr]


def test_a_measuring_probe_lists_the_collections_of_older_generations(tmp_path: Path) -> None:
    import gc

    p = Probe(tmp_path, switch=tmp_path / "switch")
    p.set_rank(RankId(world=0))
    p.watch_gc()
    try:
        gc.collect(0)  # young collections are not listed
        gc.collect(1)
        gc.collect(2)
    finally:
        gc.callbacks.remove(p._on_gc)
    p.close()
    (note,) = [r for r in read_records(tmp_path / "rank0.jsonl")[0] if r.message.startswith("gc ")]  # type: ignore[union-attr]
    seen = json.loads(note.message[3:])  # type: ignore[union-attr]
    assert [c[1] for c in seen] == [1, 2] and all(c[2] >= 0 for c in seen)


def test_a_record_another_thread_writes_while_work_is_being_finished_comes_after_it(tmp_path: Path) -> None:
    """Deferred work leaves the line only once it has run (D69): while the watchdog finishes a
    batch, a record the engine's thread writes queues behind it instead of reaching the file first."""
    p = Probe(tmp_path)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]  # this test is the watchdog
    p.set_rank(RankId(world=0))
    running, resume = threading.Event(), threading.Event()

    class Slow(Job):
        def run(self) -> None:
            running.set()
            resume.wait(5.0)
            super().run()

    p.defer(Slow(p, "finished"))
    finisher = threading.Thread(target=p._run_pending, args=(time.monotonic() + 5.0,))
    finisher.start()
    assert running.wait(5.0)
    p.note("written meanwhile")  # another thread, while the work runs
    resume.set()
    finisher.join(5.0)
    assert p.flush(timeout=5.0)
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == [  # type: ignore[union-attr]
        "finished", "written meanwhile"]


def test_the_engines_step_start_finishes_arrived_work_on_its_own_thread(tmp_path: Path) -> None:
    """No thread of the probe's takes the GIL from a busy engine to finish its records (D114)."""
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    ran_on: list[int] = []
    copied = threading.Event()

    class Watched(Job):
        def run(self) -> None:
            ran_on.append(threading.get_ident())
            super().run()

    p.defer(Watched(p, "one", copied))
    p.run_ready()  # the copies are not there: nothing is waited for
    assert ran_on == []
    copied.set()
    p.run_ready()
    assert ran_on == [threading.get_ident()]
    p.close()
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == ["one"]  # type: ignore[union-attr]


class StepClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_chores_finish_what_waited_idle_s_and_nothing_sooner(tmp_path: Path) -> None:
    """An idle SGLang scheduler runs no step but calls the pool hook every loop iteration, which
    runs the chores: work older than IDLE_S is sent and finished there, on the engine's thread."""
    clock = StepClock()
    p = Probe(tmp_path, clock=clock)
    p._start_watchdog = lambda: None  # type: ignore[method-assign]
    p.set_rank(RankId(world=0))
    sent: list[float] = []
    filling = {"now": False}
    p.batches = BatchRecorder(attach=lambda probe, record: False,
                              send_all=lambda probe: sent.append(clock.now),
                              filling=lambda probe, now: filling["now"])
    ran_on: list[int] = []

    class Watched(Job):
        def run(self) -> None:
            ran_on.append(threading.get_ident())
            super().run()

    p.defer(Watched(p, "idle batch"))
    p.chores(clock.now)
    clock.now += runtime.CHORES_S  # due again, not yet old
    assert p.next_chores <= clock.now
    p.chores(clock.now)
    assert (sent, ran_on) == ([], [])
    clock.now += runtime.IDLE_S
    filling["now"] = True  # the batch being filled, steps still joining it: left to its steps
    p.chores(clock.now)
    assert (sent, ran_on) == ([], [])
    filling["now"] = False
    clock.now += runtime.CHORES_S
    p.chores(clock.now)
    assert sent == [clock.now] and ran_on == [threading.get_ident()]
    assert p.engine_seen == clock.now and p.next_chores == clock.now + runtime.CHORES_S
    p.close()
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == ["idle batch"]  # type: ignore[union-attr]


def test_the_watchdog_acts_only_when_the_engine_has_not_come_by_for_idle_s(tmp_path: Path) -> None:
    clock = StepClock()
    p = Probe(tmp_path, clock=clock)
    p.set_rank(RankId(world=0))
    ran_on: list[int] = []

    class Watched(Job):
        def run(self) -> None:
            ran_on.append(threading.get_ident())
            super().run()

    p.chores(clock.now)  # the engine came by: its clock stands still, so it always just did
    p.defer(Watched(p, "pending", None))
    time.sleep(2.5 * runtime.WATCH_S)  # the watchdog wakes twice meanwhile
    assert ran_on == []
    clock.now += 2 * runtime.IDLE_S  # the engine stalls
    deadline = time.monotonic() + 5.0
    while not ran_on and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran_on and ran_on[0] != threading.get_ident()
    p.close()
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == ["pending"]  # type: ignore[union-attr]


def test_the_runtime_reaches_the_copy_batches_only_through_their_recorder(tmp_path: Path) -> None:
    """While a copy batch is being filled, a record goes into it when the batch takes it; one it
    refuses closes it (`send_all`) and waits behind it. A flush reaches the batches through the
    same recorder (`Probe.batches`)."""
    p = Probe(tmp_path)
    p.set_rank(RankId(world=0))
    arrived = threading.Event()
    batch = Job(p, "the batch's steps", arrived)  # deferred work standing for the batch being filled
    calls: list[str] = []

    def attach(probe: Probe, record: Record) -> bool:
        calls.append(f"attach {record.message}")  # type: ignore[union-attr]
        return len(calls) == 1  # the batch takes the first record only

    def send_all(probe: Probe) -> None:
        calls.append("send_all")
        probe.copies = None
        arrived.set()

    p.defer(batch)
    p.copies = batch  # type: ignore[assignment]
    p.batches = BatchRecorder(attach=attach, send_all=send_all, filling=lambda probe, now: False)
    p.note("taken by the batch")
    p.note("refused by the batch")
    assert calls == ["attach taken by the batch", "attach refused by the batch", "send_all"]
    assert p.flush(timeout=5.0)
    assert calls[3:] == ["send_all"]  # the flush sends what is left before it finishes it
    p.close()
    assert [r.message for r in read_records(tmp_path / "rank0.jsonl")[0]] == [  # type: ignore[union-attr]
        "the batch's steps", "refused by the batch"]


def test_an_inner_hook_is_timed_only_while_the_probe_measures_itself(tmp_path: Path) -> None:
    p = Probe(tmp_path)

    def hook(x: int) -> int:
        time.sleep(0.002)
        return x + 1

    assert p.timed_inner(hook) is hook  # evidence runs pay nothing
    p.timing = True
    timed = p.timed_inner(hook)
    assert timed(1) == 2 and p.cost[19] >= 2_000_000
    before = p.cost[19]

    def boom() -> None:
        raise ValueError("inner")

    with pytest.raises(ValueError):
        p.timed_inner(boom)()  # its own errors are the hook's to contain; the time still counts
    assert p.cost[19] >= before
    p.close()
