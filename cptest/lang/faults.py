"""`fault` statements: the action, its target rank within the world, its trigger (a time, a request
count or a decode step count) and a stop's heal time; two faults on the same target with the same
trigger conflict."""

from __future__ import annotations

from typing import Any

from cptest.lang import tables as T
from cptest.lang.settings import Values, node, unknown_word
from cptest.lang.syntax import Stmt
from cptest.scenario import Fault, Topology
from cptest.values import Duration, describe


def fault_statements(v: Values, topo: Topology | None) -> list[Fault]:
    out: list[Fault] = []
    seen: dict[tuple[Any, ...], Stmt] = {}
    world = topo.gpus if topo else None
    for s in v.many.get(("", "fault"), []):
        d = s.value
        action = str(d["action"])
        bad = False
        if action not in T.FAULT_ACTIONS:
            unknown_word(v.p, s.parts["action"], f"unknown fault action {action!r}", action, T.FAULT_ACTIONS)
            bad = True
        if action in T.SERVER_ONLY_ACTIONS and d["target"] == "rank":
            v.p.add(
                s.parts["rank"],
                f"{action} is sent to the server, not to a rank",
                expected=f"fault {action} server ...",
            )
            bad = True
        rank = d["rank"]
        if rank is not None and (rank < 0 or (world is not None and rank >= world)):
            v.p.add(
                s.parts["rank"],
                f"fault rank {rank} is outside the world",
                expected=f"0 <= rank < {world}" if world else "rank >= 0",
            )
            bad = True
        fields: dict[str, Any] = {"action": action, "target": d["target"], "rank": rank}
        if "at" in d:
            at = d["at"]
            if isinstance(at, int | float) and not isinstance(at, bool):
                v.p.add(s.parts["trigger"], "fault time needs a unit", expected=f"at {at}s", found=str(at))
                bad = True
            elif not isinstance(at, Duration) or not 0 <= at.seconds <= T.MAX_TIMEOUT_S:
                v.p.add(
                    s.parts["trigger"],
                    "invalid fault time",
                    expected=f"a duration from 0 to {T.MAX_TIMEOUT_S:g}s (at 10s)",
                    found=describe(at),
                )
                bad = True
            else:
                fields["at_s"] = at.seconds
        for trig in ("after_requests", "after_decode_steps"):
            if trig in d:
                if d[trig] < 1:
                    v.p.add(s.parts["trigger"], f"{trig.replace('_', ' ')} must be >= 1", found=str(d[trig]))
                    bad = True
                fields[trig] = d[trig]
        heal = d["for"]
        if heal is not None:
            if action != "stop":
                v.p.add(s.parts["for"], f"'for' applies to stop faults only, not {action}")
                bad = True
            elif not isinstance(heal, Duration) or not 0 < heal.seconds <= T.MAX_TIMEOUT_S:
                v.p.add(
                    s.parts["for"],
                    "invalid stop duration",
                    expected="a duration > 0 (for 5s)",
                    found=describe(heal),
                )
                bad = True
            else:
                fields["heal_after_s"] = heal.seconds
        key = (
            d["target"],
            rank,
            *(sorted((k, str(d[k])) for k in ("at", "after_requests", "after_decode_steps") if k in d)),
        )
        if key in seen:
            v.p.add(
                s.span,
                f"fault conflicts with the fault at line {seen[key].span.line} (same target, same trigger)",
            )
            bad = True
        seen.setdefault(key, s)
        if not bad:
            f = node(Fault, v.p, s.span, field_spans=dict(s.parts), **fields)
            if f is not None:
                out.append(f)
    return out
