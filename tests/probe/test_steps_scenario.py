"""The probe writes the same records for a fixed sequence of steps as it did before D69's rework.

`steps_scenario.run` drives every kind of step the probe writes (eager and replayed decode runs
split by other records and crossed by pool samples, prefill, mixed, M-RoPE, PCP zigzag, ids that
need the general path, steps without positions or with a KV write that does not fit, a replay
without a padded size, a forward that raised) on a clock only the scenario moves.

`data/steps_scenario.jsonl` was written by the probe at 3bfa576 and is the evidence's reference.
Since D72 a pool sample no longer splits the run of decode steps it was made in: its line follows
the run's `steps` line, so the file's lines differ from the reference's in that order (and in how
steps are grouped into lines) and nothing else: the same records, and the same per-kind order
that every reader of rank files sees (`RankEvidence`). `data/steps_scenario_d72.jsonl` holds the
bytes the probe wrote then; both files must keep reading as the same evidence.

Schema v6 added each eager step's layers (here one: the scenario's forwards run one layer).
`data/steps_scenario_v6.jsonl` pins the bytes the probe wrote then: without the fields of v6 it
reads as the D72 file does. Schema v7 added the attention-DP buffer of an extend step, which the
scenario (no attention DP) never sizes: `data/steps_scenario_v7.jsonl` is the v6 file with each
line's version alone changed. Schema v8 lets a run's steps differ in their layers, which the
scenario's one-layer forwards never do: `data/steps_scenario_v8.jsonl`, the bytes the probe writes
now, is the v7 file with each line's version alone changed. A change to how steps are gathered,
copied or formatted must leave it byte for byte the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import dataclasses  # noqa: E402
import json  # noqa: E402
from collections import Counter  # noqa: E402

from cptest.evidence import PoolSample, ProbeNote, RankEvidence, Step, read_records  # noqa: E402
from cptest.probe import copy_batches, runtime  # noqa: E402
from cptest.run.faults import DecodeStepCounter  # noqa: E402
from tests.probe import steps_scenario  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "steps_scenario.jsonl"
"""Written at 3bfa576, before D69 and D72: the records the probe must keep writing."""
GOLDEN_D72 = Path(__file__).parent / "data" / "steps_scenario_d72.jsonl"
"""The bytes the probe wrote since D72 (pool samples after their run's steps), before schema v6."""
GOLDEN_V6 = Path(__file__).parent / "data" / "steps_scenario_v6.jsonl"
"""The bytes the probe wrote with schema v6."""
GOLDEN_V7 = Path(__file__).parent / "data" / "steps_scenario_v7.jsonl"
"""The bytes the probe wrote with schema v7."""
GOLDEN = Path(__file__).parent / "data" / "steps_scenario_v8.jsonl"
"""The bytes the probe writes now."""


def test_the_engines_thread_alone_writes_the_golden_bytes(tmp_path: Path) -> None:
    assert steps_scenario.run(tmp_path, watchdog=False) == GOLDEN.read_bytes()


def test_the_watchdog_leaves_a_busy_engines_records_byte_for_byte_alone(tmp_path: Path) -> None:
    assert steps_scenario.run(tmp_path, watchdog=True) == GOLDEN.read_bytes()


@pytest.mark.parametrize("watchdog", [False, True], ids=["engine", "watchdog"])
def test_the_writer_process_writes_the_golden_bytes(tmp_path: Path, watchdog: bool) -> None:
    """The rank file's writer process makes the `steps` lines and pool samples the probe hands it
    with the probe's own functions, after every line the probe made itself: the same bytes."""
    assert steps_scenario.run(tmp_path, watchdog=watchdog, writer="process") == GOLDEN.read_bytes()


def test_todays_copy_batches_group_the_lines_otherwise_and_write_the_same_evidence(tmp_path: Path) -> None:
    """The golden bytes are the scenario's in batches of the golden's size, smaller than today's:
    in today's, fewer `steps` lines carry the same Step records, and every other record is the
    same, in the same order per kind as every reader of rank files sees them (`RankEvidence`).
    A step's own notes are written when its batch is finished, so they fall elsewhere among the
    notes written at once, with that time: the same notes, in another order."""
    got_path = tmp_path / "today.jsonl"
    got_path.write_bytes(steps_scenario.run(tmp_path / "run", watchdog=False,
                                            bounds=(copy_batches.COPY_EVERY, runtime.COPY_WITHIN_S)))
    assert steps_scenario.GOLDEN_BOUNDS[0] < copy_batches.COPY_EVERY
    got, got_dropped = read_records(got_path)
    ref, ref_dropped = read_records(GOLDEN)
    assert got_dropped == ref_dropped == 0
    ev_got, ev_ref = RankEvidence.of(1, got), RankEvidence.of(1, ref)
    for f in dataclasses.fields(RankEvidence):
        if f.name != "notes":
            assert getattr(ev_got, f.name) == getattr(ev_ref, f.name), f.name
    assert Counter((n.level, n.message) for n in ev_got.notes) == Counter(
        (n.level, n.message) for n in ev_ref.notes)
    assert ev_got.steps and ev_got.pool_samples and ev_got.notes
    lines = got_path.read_text().count('"kind":"steps"')
    assert 0 < lines < GOLDEN.read_text().count('"kind":"steps"')


@pytest.mark.parametrize("path", [REFERENCE, GOLDEN_D72, GOLDEN_V6, GOLDEN_V7, GOLDEN],
                         ids=["reference", "d72", "v6", "v7", "golden"])
def test_the_scenario_file_holds_every_kind_of_step_line(path: Path) -> None:
    text = path.read_text()
    recs, dropped = read_records(path)
    steps = [r for r in recs if isinstance(r, Step)]
    assert dropped == 0 and [s.step for s in steps] == [s for s in range(1, 94) if s not in (51, 52)]
    assert {s.mode for s in steps} == {"extend", "decode", "mixed", "idle"}
    assert any(s.graph_rows == 4 for s in steps) and any(s.graph_rows == 64 for s in steps)
    assert any(s.cp_active for s in steps)
    for kind in ('"kind":"steps"', '"kind":"step"', '"kind":"pool_sample"', '"rows":{', '"positions":['):
        assert kind in text, kind
    notes = [r.message for r in recs if isinstance(r, ProbeNote)]
    assert any("no KV write seen" in n for n in notes) and any("does not match" in n for n in notes)


def _non_step_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines()
            if '"kind":"step"' not in line and '"kind":"steps"' not in line]


def test_the_d72_file_reads_as_the_same_evidence_as_the_reference() -> None:
    """D72 moved each pool sample after the steps of the run it was made in. What the readers of
    rank files see is unchanged: the same records (Step records as read_records expands `steps`
    lines), the same records of each kind in the same order (RankEvidence: every checker, contract
    and report reads a rank's records through it, cptest/checks/load.py), the same sequence of every
    line that is not a step's (pool samples, notes, capacity, graph counts: only steps moved
    around them), and the same count for the fault trigger that reads the file itself."""
    ref, ref_dropped = read_records(REFERENCE)
    got, got_dropped = read_records(GOLDEN_D72)
    assert ref_dropped == got_dropped == 0
    assert Counter(r.model_dump_json() for r in got) == Counter(r.model_dump_json() for r in ref)
    ev_ref, ev_got = RankEvidence.of(1, ref), RankEvidence.of(1, got)
    for f in dataclasses.fields(RankEvidence):
        assert getattr(ev_got, f.name) == getattr(ev_ref, f.name), f.name
    assert ev_got.steps and ev_got.pool_samples and ev_got.notes and ev_got.capacities
    assert _non_step_lines(GOLDEN_D72) == _non_step_lines(REFERENCE)
    assert DecodeStepCounter(GOLDEN_D72).poll() == DecodeStepCounter(REFERENCE).poll() == sum(
        isinstance(r, Step) and r.mode == "decode" for r in ref)
    # What moved: only pool samples, and only later, past decode steps (of the run they were made
    # in); every other line has the same steps before it as in the reference.
    ref_at, got_at = _steps_before_each_other_line(REFERENCE), _steps_before_each_other_line(GOLDEN_D72)
    assert [kind for kind, _ in got_at] == [kind for kind, _ in ref_at]
    moved = 0
    for (kind, got_before), (_, ref_before) in zip(got_at, ref_at, strict=True):
        if kind == "pool_sample":
            assert got_before[:len(ref_before)] == ref_before
            assert all(mode == "decode" for _, mode in got_before[len(ref_before):])
            moved += len(got_before) > len(ref_before)
        else:
            assert got_before == ref_before, kind
    assert moved > 5
    assert len([r for r in got if isinstance(r, PoolSample)]) > 10
    assert GOLDEN_D72.read_text().count("\n") < REFERENCE.read_text().count("\n")


@pytest.mark.parametrize(("before", "after", "v"), [(GOLDEN_V6, GOLDEN_V7, 6), (GOLDEN_V7, GOLDEN, 7)],
                         ids=["v7", "golden"])
def test_each_later_file_is_the_one_before_with_its_version_alone_changed(before: Path, after: Path,
                                                                          v: int) -> None:
    old_lines, new_lines = before.read_text().splitlines(), after.read_text().splitlines()
    assert len(new_lines) == len(old_lines) > 50
    for old, new in zip(old_lines, new_lines, strict=True):
        assert old.startswith(f'{{"v":{v},') and new == f'{{"v":{v + 1},' + old[len(f'{{"v":{v},'):]


def test_the_v6_file_is_the_d72_one_with_each_eager_steps_layers() -> None:
    """Schema v6 changed nothing the D72 file says: its records, the v6 fields dropped, are the
    same in the same order; each step whose forward hooks fired says it ran one layer (the scenario's
    forwards call each hook once), any other none; no other v6 field is set (the scenario has no
    MLP output, KV slots or per-layer rows)."""
    old, _ = read_records(GOLDEN_D72)
    new, _ = read_records(GOLDEN_V6)
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        if isinstance(a, Step):
            assert a.layers == (None if a.ffn_rows is None else 1), a.step  # the hooks fired together
            assert (a.ffn_out_rows, a.layer_rows, a.kv_slots, a.kv_read) == (None, None, {}, {})
            a = a.model_copy(update={"layers": None, "v": b.v})
        else:
            a = a.model_copy(update={"v": b.v})
        assert a == b
    assert GOLDEN_V6.read_text().count('"layers":1') > 10


def _steps_before_each_other_line(path: Path) -> list[tuple[str, list[tuple[int, str]]]]:
    """For each line that is not a step's, its kind and the (step, mode) of every step before it."""
    out: list[tuple[str, list[tuple[int, str]]]] = []
    steps: list[tuple[int, str]] = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "step":
            steps.append((rec["step"], rec["mode"]))
        elif rec["kind"] == "steps":
            steps.extend((k, "decode") for k in rec["step"])
        else:
            out.append((rec["kind"], list(steps)))
    return out
