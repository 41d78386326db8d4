#!/usr/bin/env python3
"""Extract the CLI flag table of one SGLang release into `cptest/engines/sglang/flags-<release>.json`.

Contract: the table is what SGLang's own argparse builds (`ServerArgs.add_cli_args(parser)`), read
from a Python interpreter where that release's wheel is importable (a scratch venv; the wheel needs
torch and a handful of light dependencies to import `sglang.srt.server_args`, no GPU). Each flag
records its option strings, destination, arity, the type of one value (from argparse's `type=`,
`VALUE_TYPES`), choices, default (when JSON-able), whether it is a deprecated alias, and the
`path:line` of its declaration in the wheel. The output also records the
wheel's sha256 and how it was extracted, so a reviewer can regenerate and diff it.

When the release cannot be imported (missing heavy deps), `--method ast` reads the source instead:
it only knows the dataclass fields declared with `A[...]` (no dynamic or deprecated flags) and says
so in the output (`"method": "ast"`). The argparse method is the one committed tables use.

Usage (argv only; the helper interpreter is run without a shell):

    python tools/extract_sglang_flags.py --release 0.5.17 \\
        --wheel /tmp/sgl/sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl \\
        --python /tmp/sglvenv/bin/python [--pythonpath DIR] [--out PATH]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "cptest" / "engines" / "sglang"

# Runs inside the helper interpreter: builds SGLang's parser and prints its actions as JSON.
# Kept as source text because that interpreter has sglang and torch, and this one need not.
_DUMP = r"""
import argparse, json, sys, warnings
warnings.simplefilter("ignore")
import sglang
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(add_help=False)
ServerArgs.add_cli_args(parser)

def jsonable(v):
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return repr(v)

out = []
for a in parser._actions:
    if not a.option_strings:
        continue
    nargs = a.nargs
    if nargs is None:
        no_value = ("TrueAction", "FalseAction", "ConstAction", "CountAction")
        nargs = 0 if a.__class__.__name__.endswith(no_value) else 1
    out.append({
        "options": list(a.option_strings),
        "dest": a.dest,
        "action": type(a).__name__,
        "nargs": nargs,
        # A set's order changes with the hash seed: sorted, so that a regenerated table diffs clean.
        "choices": None if a.choices is None else [jsonable(c) for c in (
            sorted(a.choices, key=str) if isinstance(a.choices, (set, frozenset)) else a.choices)],
        "default": jsonable(a.default),
        "required": bool(a.required),
        "type": None if a.type is None else
                f"{getattr(a.type, '__module__', '')}.{getattr(a.type, '__qualname__', repr(a.type))}",
    })
print(json.dumps({"sglang_file": sglang.__file__, "version": getattr(sglang, "__version__", None),
                  "actions": out}))
"""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def arg_sources(wheel: Path) -> dict[str, str]:
    """Python sources of the wheel's argument declarations, keyed by path relative to `sglang/srt/`."""
    out: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name == "sglang/srt/server_args.py" or (
                name.startswith("sglang/srt/arg_groups/") and name.endswith(".py")
            ):
                out[name.removeprefix("sglang/srt/")] = z.read(name).decode("utf-8")
    return out


def locate(sources: dict[str, str], dest: str, options: list[str], literal_first: bool = False) -> str | None:
    """`path:line` where a flag is declared: the dataclass field or the `"--flag"` literal.

    Deprecated aliases are registered by hand (`parser.add_argument("--old", ...)`) and often share
    their `dest` with a hidden field, so for them the literal is tried first.
    """

    def by_field() -> str | None:
        # Blanks only, not `\s`: `\s+` after `^` also crosses a blank line above the field, which put
        # the field's line one too early.
        field_re = re.compile(rf"^[ \t]+{re.escape(dest)}[ \t]*:[ \t]*A\[", re.M)
        for path, text in sorted(sources.items()):
            m = field_re.search(text)
            if m:
                return f"{path}:{text.count(chr(10), 0, m.start()) + 1}"
        return None

    def by_literal() -> str | None:
        for opt in options:
            for path, text in sorted(sources.items()):
                i = text.find(f'"{opt}"')
                if i >= 0:
                    return f"{path}:{text.count(chr(10), 0, i) + 1}"
        return None

    first, second = (by_literal, by_field) if literal_first else (by_field, by_literal)
    return first() or second()


VALUE_TYPES: dict[str, str] = {
    # argparse `type=` (module.qualname) -> the value type cptest checks a scenario's value against
    # (cptest/engines/sglang/flag_values.py). A converter not listed here is written as its own
    # name, which no checker knows: the table test then fails until someone reads it and maps it.
    "builtins.str": "str",
    "builtins.int": "int",
    "builtins.float": "float",
    "json.loads": "json",
    "sglang.srt.utils.common.json_list_type": "json",
    "sglang.srt.utils.common.nullable_str": "str",
    "sglang.srt.utils.common.human_readable_int": "size",
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": "json-object",
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": "str",
}


def value_type(arity: str, raw: str | None) -> str | None:
    """What one value of the flag must be: None for a switch; argparse's default converter is str."""
    if arity == "flag":
        return None
    if raw is None:
        return "str"
    return VALUE_TYPES.get(raw, raw)


def kind_of(action: str, nargs: Any) -> str:
    """Arity class cptest needs: `flag` (no value), `value` (exactly one), `optional` (0 or 1), `list`."""
    if action == "BooleanOptionalAction":
        return "flag"
    if nargs == 0:
        return "flag"
    if nargs == 1 or nargs is None:
        return "value"
    if nargs == "?":
        return "optional"
    return "list"


def extract_argparse(python: str, pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    # Run from an empty directory so a checkout named `sglang` in the cwd cannot shadow the wheel.
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [python, "-c", _DUMP], capture_output=True, text=True, env=env, cwd=cwd, timeout=600, check=False
        )
    if proc.returncode != 0:
        raise SystemExit(f"helper interpreter failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(last)


def extract_ast(sources: dict[str, str]) -> dict[str, Any]:
    """Fallback: dataclass fields `name: A[type, ...] = default` (no dynamic or deprecated flags)."""
    actions = []
    for _path, text in sorted(sources.items()):
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            ann = node.annotation
            if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                continue
            seg = ast.get_source_segment(text, ann) or ""
            if "no_cli=True" in seg:
                continue
            name = node.target.id
            is_bool = isinstance(ann.slice, ast.Tuple) and ast.unparse(ann.slice.elts[0]) == "bool"
            default: Any = None
            if node.value is not None:
                try:
                    default = ast.literal_eval(node.value)
                except ValueError:
                    default = ast.unparse(node.value)
            actions.append(
                {
                    "options": ["--" + name.replace("_", "-")],
                    "dest": name,
                    "action": "StoreTrueAction" if is_bool else "StoreAction",
                    "nargs": 0 if is_bool else 1,
                    "choices": None,
                    "default": default,
                    "required": False,
                }
            )
    return {"sglang_file": None, "version": None, "actions": actions}


def build_table(
    release: str, wheel: Path, raw: dict[str, Any], method: str, sources: dict[str, str]
) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for a in raw["actions"]:
        if a["dest"] == "help":
            continue
        primary = a["options"][0]
        arity = kind_of(a["action"], a["nargs"])
        entry = {
            "dest": a["dest"],
            "aliases": a["options"][1:],
            "arity": arity,
            "nargs": a["nargs"],
            "type": value_type(arity, a.get("type")),
            "choices": a["choices"],
            "default": a["default"],
            "deprecated": "Deprecated" in a["action"],
            "action": a["action"],
            "source": locate(sources, a["dest"], a["options"], literal_first="Deprecated" in a["action"]),
        }
        flags[primary] = entry
    return {
        "release": release,
        "wheel": wheel.name,
        "wheel_sha256": sha256_file(wheel),
        "method": method,
        "method_detail": (
            "argparse: sglang.srt.server_args.ServerArgs.add_cli_args(parser), parser._actions"
            if method == "argparse"
            else "ast: dataclass fields A[...] only; dynamic/deprecated flags missing"
        ),
        "generator": "tools/extract_sglang_flags.py",
        "flags": dict(sorted(flags.items())),
    }


def render(table: dict[str, Any]) -> str:
    """JSON with one flag per line, so a regenerated table diffs flag by flag."""
    head = {k: v for k, v in table.items() if k != "flags"}
    lines = ["{"]
    lines += [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    lines.append(' "flags": {')
    items = list(table["flags"].items())
    for i, (k, v) in enumerate(items):
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)}{',' if i < len(items) - 1 else ''}")
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", required=True)
    ap.add_argument("--wheel", required=True, type=Path)
    ap.add_argument("--python", help="interpreter where this release's sglang imports (argparse method)")
    ap.add_argument("--pythonpath", help="prepended to PYTHONPATH for --python (e.g. a --target dir)")
    ap.add_argument("--method", choices=["argparse", "ast"], default="argparse")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    sources = arg_sources(args.wheel)
    if args.method == "argparse":
        if not args.python:
            ap.error("--method argparse needs --python")
        raw = extract_argparse(args.python, args.pythonpath)
        if raw.get("version") and raw["version"] != args.release:
            raise SystemExit(
                f"helper imported sglang {raw['version']} from {raw['sglang_file']}, "
                f"not {args.release}; fix --python/--pythonpath"
            )
    else:
        raw = extract_ast(sources)
    table = build_table(args.release, args.wheel, raw, args.method, sources)
    out = args.out or OUT_DIR / f"flags-{args.release}.json"
    out.write_text(render(table))
    print(f"wrote {out}: {len(table['flags'])} flags ({args.method})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
