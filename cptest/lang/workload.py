"""The `workload` block: request count and lengths, closed or open loop (or fill_drain), sampling,
and the prompts' source (synthetic, or a dataset file whose metadata is checked here)."""

from __future__ import annotations

import os
import stat

from cptest.errors import Span, did_you_mean
from cptest.lang import tables as T
from cptest.lang.settings import Values, missing_block, node, was_written
from cptest.scenario import Sampling, Workload


def workload_block(v: Values, where: Span) -> Workload | None:
    opener = v.stmt("", "workload")
    if opener is None:
        missing_block(v, "workload", where)
        return None
    values, spans = v.block("workload")
    ok = True
    for key, field in (
        ("requests", "requests"),
        ("prompt_tokens", "prompt_tokens"),
        ("output_tokens", "output_tokens"),
    ):
        if field not in values:
            ok = False
            if not was_written(v, "workload", key):
                v.p.add(opener.span, f"workload needs {key}")
    conc, rate = v.stmt("workload", "concurrency"), v.stmt("workload", "rate")
    if conc and rate:
        later = max(conc, rate, key=lambda s: (s.span.file, s.span.line, s.span.col))
        v.p.add(
            later.span,
            "workload sets both concurrency and rate",
            hint="closed loop: concurrency N; open loop: rate R (requests per second)",
        )
        ok = False
    elif not conc and not rate and not v.stmt("workload", "fill_drain"):
        v.p.add(opener.span, "workload needs concurrency (closed loop) or rate (open loop)")
        ok = False
    fill = v.stmt("workload", "fill_drain")
    overridden = 0
    if fill and (conc or rate):
        other = conc or rate
        assert other is not None
        if other is conc and conc.span.file != where.file and fill.span.file == where.file:
            # An extends file's concurrency gives way to the scenario's fill_drain (the extending file
            # wins, as everywhere in a chain); written beside it, or against an inherited fill_drain,
            # it is a contradiction.
            values.pop("concurrency", None)
            overridden = 1
        else:
            v.p.add(fill.span, "fill_drain sets the workload's concurrency itself (from the KV pool's size)",
                    hint=f"remove {'concurrency' if other is conc else 'rate'}")
            ok = False
    samp = v.stmt("workload", "sampling")
    if samp is not None:
        mode = str(samp.value)
        body, bspans = v.block("sampling")
        if mode not in ("greedy", "sample"):
            close = did_you_mean(mode, ("greedy", "sample"))
            v.p.add(
                samp.parts["mode"],
                f"unknown sampling {mode!r}",
                expected="greedy or sample { ... }",
                hint=f"did you mean '{close}'?" if close else None,
            )
        elif mode == "greedy" and any(b == "sampling" for (b, _k) in v.one):
            v.p.add(
                samp.span,
                "greedy sampling takes no settings",
                hint="write: sampling sample { temperature ... }",
            )
        else:
            sampling = node(Sampling, v.p, samp.span, field_spans=bspans, mode=mode, **body)
            if sampling is not None:
                values["sampling"] = sampling
                spans["sampling"] = samp.span
    src = v.stmt("workload", "source")
    if src is not None:
        kind, path = src.value
        if str(kind) == "synthetic" and path is None:
            values["source"] = "synthetic"
        elif str(kind) == "dataset" and path is not None:
            values["source"] = "dataset"
            values["dataset_path"] = os.path.normpath(os.path.join(os.path.dirname(src.span.file), path))
            problem = _dataset_problem(values["dataset_path"])
            if problem is not None:
                v.p.add(src.span, problem,
                        expected=f"a JSON-lines file of at most {T.MAX_DATASET_BYTES:,} bytes")
        else:
            v.p.add(src.span, "invalid source", expected='source synthetic or source dataset "path.jsonl"')
        spans["source"] = src.span
    if not ok or len(values) + overridden < len(
        [k for (b, k) in v.one if b == "workload" and k not in ("sampling", "source")]
    ):
        return None
    if values.get("source") != "dataset":
        biggest = values["prompt_tokens"].bounds()[1]
        if values["requests"] * biggest > T.MAX_PLAN_TOKENS:
            v.p.add(spans.get("requests", opener.span),
                    f"the workload asks for up to {values['requests'] * biggest:,} prompt tokens "
                    f"({values['requests']:,} requests x {biggest:,}); the plan stores every one",
                    expected=f"requests x the largest prompt_tokens <= {T.MAX_PLAN_TOKENS:,}")
            return None
    return node(Workload, v.p, opener.span, field_spans=spans, **values)


def _dataset_problem(path: str) -> str | None:
    """Why the dataset at `path` cannot be read into a plan, from its metadata alone (the plan stage
    reads it): not a regular file (`/dev/zero`, a FIFO, a folder) or too large. A file that does not
    exist yet is the plan's business."""
    if "\0" in path:
        return "a dataset path cannot contain a NUL character"
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"dataset {path} is not a regular file"
    if st.st_size > T.MAX_DATASET_BYTES:
        return f"dataset {path} is larger than {T.MAX_DATASET_BYTES:,} bytes"
    return None
