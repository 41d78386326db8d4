"""The probe writes the same bytes for a fixed sequence of steps as it did before D69's rework.

`steps_scenario.run` drives every kind of step the probe writes (eager and replayed decode runs
split by pool samples and other records, prefill, mixed, M-RoPE, PCP zigzag, ids that need the
general path, steps without positions or with a KV write that does not fit, a replay without a
padded size, a forward that raised) on a clock only the scenario moves. The golden file was
written by the probe at 3bfa576: a change to how steps are gathered, copied or formatted must
leave it byte for byte the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cptest.evidence import ProbeNote, Step, read_records  # noqa: E402
from tests.probe import steps_scenario  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "steps_scenario.jsonl"


def _note_times_out(text: bytes) -> str:
    """The file with the `t` of its notes blanked: a note made when a batch is finished carries the
    time it was finished, which depends on when the writer thread came by."""
    return re.sub(r'^\{"v":(\d+),"t":[0-9.e-]+,"kind":"probe_note"', r'{"v":\1,"t":_,"kind":"probe_note"',
                  text.decode(), flags=re.M)


def test_the_engines_thread_alone_writes_the_golden_bytes(tmp_path: Path) -> None:
    assert steps_scenario.run(tmp_path, writer=False) == GOLDEN.read_bytes()


def test_with_the_writer_thread_the_records_are_the_same_but_for_when_notes_were_made(tmp_path: Path) -> None:
    got = steps_scenario.run(tmp_path, writer=True)
    assert _note_times_out(got) == _note_times_out(GOLDEN.read_bytes())


def test_the_golden_file_holds_every_kind_of_step_line() -> None:
    text = GOLDEN.read_text()
    recs, dropped = read_records(GOLDEN)
    steps = [r for r in recs if isinstance(r, Step)]
    assert dropped == 0 and [s.step for s in steps] == [s for s in range(1, 94) if s not in (51, 52)]
    assert {s.mode for s in steps} == {"extend", "decode", "mixed", "idle"}
    assert any(s.graph_rows == 4 for s in steps) and any(s.graph_rows == 64 for s in steps)
    assert any(s.cp_active for s in steps)
    for kind in ('"kind":"steps"', '"kind":"step"', '"kind":"pool_sample"', '"rows":{', '"positions":['):
        assert kind in text, kind
    notes = [r.message for r in recs if isinstance(r, ProbeNote)]
    assert any("no KV write seen" in n for n in notes) and any("does not match" in n for n in notes)
