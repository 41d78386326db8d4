"""The `serve` block: the engine's settings, its pass-through flags and its environment, each flag
and variable judged by the engine release's safety table (`cptest.lang.safety`)."""

from __future__ import annotations

import re

from cptest.lang import safety
from cptest.lang.settings import Values, node
from cptest.lang.syntax import Stmt
from cptest.scenario import Engine, Serve


def serve_block(v: Values, engine: Engine | None, unsafe: str | None) -> Serve:
    """The serve block. Every `env` and `flag` is judged by the engine release's safety table
    (`cptest.lang.safety`): one that loads code or config is an error at its statement unless the
    scenario declares `unsafe "reason"`; one the machine or cptest owns is an error regardless."""
    opener = v.stmt("", "serve")
    values, spans = v.block("serve")
    policy = safety.policy_for(engine.kind, engine.release) if engine else safety.LATEST
    escaped: list[Stmt] = []

    def judge(s: Stmt, verdict: safety.Verdict | None) -> None:
        if verdict is None:
            return
        if verdict.escapable and unsafe is not None:
            escaped.append(s)
            return
        hint = ('declare it: unsafe "why this scenario needs it", and run with --allow-unsafe'
                if verdict.escapable else "remove it: the scenario cannot change this")
        v.p.add(s.span, f"{'unsafe' if verdict.escapable else 'not allowed'}: {verdict.reason}", hint=hint)

    flags: list[list[str]] = []
    for i, s in enumerate(v.many.get(("serve", "flag"), [])):
        if not s.value[0].startswith("--"):
            v.p.add(s.span, f"flag {s.value[0]!r} must start with --", expected='flag "--name" ["value"]')
        else:
            judge(s, safety.flag_verdict(policy, s.value[0]))
        # Never escapable: a value read as an option sets a flag no table judged (the gate above
        # sees only the statement's first word), and a scenario that wants a flag writes its own.
        for k, value in enumerate(s.value[1:], 1):
            if safety.option_like(value):
                v.p.add(s.parts.get(str(k), s.span),
                        f"flag {s.value[0]}: the value {value!r} would be read as an option, not as a value",
                        expected="a value that does not start with - (a negative number does)",
                        hint="each flag is a statement of its own")
        flags.append(list(s.value))
        spans[f"flag:{i}"] = s.span
        spans.update({f"flag:{i}:{k}": span for k, span in s.parts.items()})
    env: dict[str, str] = {}
    for s in v.many.get(("serve", "env"), []):
        name, value = s.value
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            v.p.add(s.span, f"invalid environment variable name {name!r}", expected='env "NAME" "value"')
        elif name in env:
            v.p.add(s.span, f"duplicate env {name!r}")
        else:
            judge(s, safety.env_verdict(policy, name, value))
        env[name] = value
        spans[f"env:{name}"] = s.span
    declared = v.stmt("", "unsafe")
    if declared is not None and unsafe is not None and not escaped:
        v.p.add(declared.span, "unsafe is declared but the scenario sets no unsafe env or flag",
                hint="remove the unsafe statement")
    return (
        node(
            Serve,
            v.p,
            opener.span if opener else None,
            field_spans=spans,
            extra_flags=flags,
            env=env,
            **values,
        )
        or Serve()
    )
