"""The interpreter an SGLang server runs on: named, found, asked which SGLang it imports, recorded.

The plan is machine-independent: SGLang's argv starts with a bare `python3 -m
sglang.launch_server`. Which interpreter that is, is this machine's business, decided at run time:

1. `--engine-python PATH` (run, suite, rerun), else
2. `$CPTEST_SGLANG_PYTHON`, else
3. the first `python3` on PATH (what a bare `python3` always meant),

made absolute without resolving links: a virtual environment's `bin/python3` is a link to the
base interpreter, and resolving it would lose the environment and its `sglang`. Before the archive
is begun, `inspect` runs that interpreter once (`import sglang`, its version and install facts, a
time limit) and preflight turns what it says into causes: no such interpreter, no importable
`sglang`, no version to be read, or a version that is not the plan's release are all `unknown`
(exit 3: the machine's environment, not the engine's behaviour). The launcher then runs exactly the
interpreter that was inspected, and the manifest's environment records its path (portable where it
lies under a known root) and its SGLang facts in place of cptest's own interpreter's.

The reference engine runs on cptest's own interpreter (`process.own_interpreter`); a container
runs its image's, pinned by digest, so neither is inspected here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cptest.plan.model import Plan
    from cptest.run.launcher import Launcher

ENV_VAR = "CPTEST_SGLANG_PYTHON"
DEFAULT = "python3"
INSPECT_TIMEOUT_S = 60.0
"""`import sglang` imports torch and more on a real install: seconds, longer on a loaded machine.
A hung import must still not hang the run."""
MARK = "CPTEST-SGLANG-INSTALL "
"""The prefix of the line `INSPECT_CODE` prints: sglang's import may print lines of its own."""

INSPECT_CODE = """\
import json, sys
out = {"executable": sys.executable, "python": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import sglang
except BaseException as e:
    out["error"] = ("%s: %s" % (type(e).__name__, e))[:500]
else:
    version = getattr(sglang, "__version__", None)
    out["version"] = version if isinstance(version, str) else None
    try:
        import hashlib, importlib.metadata as md
        dist = md.distribution("sglang")
        out["dist_version"] = dist.version
        record = dist.read_text("RECORD")
        out["record_sha256"] = hashlib.sha256(record.encode()).hexdigest() if record else None
        direct = json.loads(dist.read_text("direct_url.json") or "{}").get("archive_info", {})
        wheel = (direct.get("hashes") or {}).get("sha256")
        out["wheel_sha256"] = wheel or str(direct.get("hash", "")).replace("sha256=", "") or None
    except Exception as e:
        out["dist_error"] = ("%s: %s" % (type(e).__name__, e))[:300]
print("CPTEST-SGLANG-INSTALL " + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class EnginePython:
    """The SGLang interpreter of a run, and what it said when asked."""

    path: str | None
    """Absolute, links kept; None when the name was not found."""
    named_by: str
    """`--engine-python`, `CPTEST_SGLANG_PYTHON` or `PATH`."""
    version: str | None = None
    """`sglang.__version__`, else its distribution's version; None when it cannot be read."""
    record_sha256: str | None = None
    wheel_sha256: str | None = None
    error: str | None = None
    """Why there is no version: the interpreter is missing, would not run, or cannot import sglang."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.version is not None


def locate(named: str | os.PathLike[str] | None = None, *, environ: dict[str, str] | None = None,
           cwd: Path | None = None) -> tuple[str | None, str, str]:
    """(absolute path or None, what named it, the name asked for) by the order of the module
    docstring. A name with a separator is a path (relative to `cwd`), one without is looked up on
    PATH. Links are not resolved."""
    env = os.environ if environ is None else environ
    if named is not None and str(named):
        name, by = str(named), "--engine-python"
    elif env.get(ENV_VAR):
        name, by = env[ENV_VAR], ENV_VAR
    else:
        name, by = DEFAULT, "PATH"
    if os.sep in name:
        path = Path(name).expanduser()
        path = path if path.is_absolute() else (cwd or Path.cwd()) / path
        return (os.path.normpath(path) if path.exists() else None), by, name
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    return (os.path.abspath(found) if found else None), by, name


_CACHE: dict[tuple[str, int, str, str], EnginePython] = {}


def inspect(named: str | os.PathLike[str] | None = None, *, timeout_s: float = INSPECT_TIMEOUT_S,
            environ: dict[str, str] | None = None) -> EnginePython:
    """Locate the SGLang interpreter and ask it, in one subprocess with a time limit, whether it
    imports `sglang` and which version. Never raises: what went wrong is `error`. Cached in this
    process per interpreter (its path and modification time), PYTHONPATH and working folder: a
    rerun or a pytest session asks once."""
    env = dict(os.environ if environ is None else environ)
    path, by, name = locate(named, environ=env)
    if path is None:
        where = "no such file" if os.sep in name else f"not on PATH ({env.get('PATH', '')!r})"
        return EnginePython(None, by, error=f"{name!r} (named by {by}): {where}")
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        return EnginePython(path, by, error=f"{path} (named by {by}) is not an executable file")
    key = (path, os.stat(path).st_mtime_ns, env.get("PYTHONPATH", ""), os.getcwd())
    if key in _CACHE:
        return _CACHE[key]
    found = _ask(path, by, env, timeout_s)
    if found.error is None or "did not answer" not in found.error:  # a timeout may pass next time
        _CACHE[key] = found
    return found


def _ask(path: str, by: str, env: dict[str, str], timeout_s: float) -> EnginePython:
    try:
        done = subprocess.run([path, "-c", INSPECT_CODE], env=env, capture_output=True, text=True,
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return EnginePython(path, by, error=f"{path} did not answer `import sglang` within {timeout_s:g} s")
    except OSError as e:
        return EnginePython(path, by, error=f"{path} (named by {by}) cannot be run: {e.strerror}")
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith(MARK)), None)
    if line is None:
        tail = (done.stderr.strip().splitlines() or [""])[-1][:300]
        return EnginePython(path, by, error=f"{path} (named by {by}) is not a Python that answered "
                            f"(exit {done.returncode}{f': {tail}' if tail else ''})")
    try:
        out = json.loads(line[len(MARK):])
    except ValueError:
        return EnginePython(path, by, error=f"{path} answered something unreadable")
    if out.get("error"):
        return EnginePython(path, by, error=f"{path} (named by {by}, Python {out.get('python')}) cannot "
                            f"import sglang: {out['error']}")
    version = out.get("version") or out.get("dist_version")
    return EnginePython(path, by, version=version if isinstance(version, str) else None,
                        record_sha256=out.get("record_sha256"), wheel_sha256=out.get("wheel_sha256"),
                        error=None if version else f"{path} imports sglang but no version can be read "
                        "(no sglang.__version__, no installed distribution)")


_RELEASE_OF = re.compile(r"^v?(?P<release>\d+(?:\.\d+)*)(?:\.post\d+)?(?:\+[A-Za-z0-9.]+)?$")


def same_release(installed: str, release: str) -> bool:
    """Whether SGLang `installed` is the release `release` a plan pins: the same version, or a
    post-release or local build of it (`<release>.post1`, `<release>+cu128`). A pre-release, a dev build
    or another version is not: the release table's argv and predictions are `release`'s."""
    if installed == release:
        return True
    m = _RELEASE_OF.match(installed.strip())
    return m is not None and m.group("release") == release


def inspect_launched(launched: Plan, launcher: Launcher) -> EnginePython | None:
    """What SGLang's interpreter says (`inspect`) when a server of the plan runs
    SGLang on a host interpreter (a launcher with `engine_python`: process, slurm; a container runs
    its image's), else None. An interpreter that answered becomes the launcher's, by its absolute
    path: the one preflight judged is the one launched."""
    if not hasattr(launcher, "engine_python") or not any(s.engine == "sglang" for s in launched.servers()):
        return None
    found = inspect(launcher.engine_python)
    if found.ok:
        launcher.engine_python = found.path
    return found


def manifest_facts(env: Mapping[str, Any], found: EnginePython | None, launcher: Launcher) -> dict[str, Any]:
    """The manifest's facts of the engine's interpreter: SGLang's (its path, what named it, and the
    SGLang install it imports, in place of cptest's own interpreter's), the reference engine's
    (cptest's own), or none under a container (its image's, pinned by digest)."""
    reasons = dict(env.get("reasons") or {})
    if found is not None:
        out = {"engine_python": found.path, "engine_python_named_by": found.named_by, "sglang": found.version,
               "sglang_wheel_sha256": found.wheel_sha256, "sglang_record_sha256": found.record_sha256}
        reasons.pop("sglang", None)
        why = {"sglang_wheel_sha256": "pip recorded no wheel hash (installed from an index, or not by pip)",
               "sglang_record_sha256": "its sglang distribution has no RECORD (not installed by pip)"}
        for key, reason in why.items():
            reasons.pop(key, None)
            if out[key] is None:
                reasons[key] = reason
    elif hasattr(launcher, "engine_python"):
        out = {"engine_python": sys.executable}
    else:
        out = {"engine_python": None}
        reasons["engine_python"] = "the image's interpreter (pins.image_digest)"
    return out | {"reasons": reasons}
