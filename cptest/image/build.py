"""Images cptest makes itself from pinned inputs: the CPU reference engine's runtime.

No registry is reachable from CI or the development machines, so `cptest image build reference`
assembles the image from what the machine has and loads it through the Docker API. The image is
one layer, a root filesystem of

- the files of Debian packages installed here (`Recipe.debian`), each regular file checked against
  dpkg's own md5sums (a conffile against the md5 dpkg recorded for it): the package's bytes, never
  what an administrator changed; documentation and translations are left out (`DEBIAN_EXCLUDES`);
- Python wheels (`Recipe.wheels`) fetched by pip at the pinned version and checked by sha256,
  unpacked as the wheel holds them (its purelib/platlib), less `Recipe.wheel_excludes`;
- a few fixed files: `/etc/passwd`, `/etc/group`, the merged-/usr links, `python3`, `/tmp`.

Entries are sorted, owned by 0:0, dated at the epoch, mode 0755 or 0644 (by the source's execute
bit), so the layer's bytes are a function of the inputs. cptest writes the image config itself
(created at the epoch, no fact of the host) and loads a docker-archive (`docker load` format), so
the image ID, the sha256 of that config, is a function of the inputs too: the same inputs give the
same ID on any machine, computed before any engine sees the image (`Built.digest`).

The cptest package is not in the image: the docker launcher mounts the running checkout's package
read-only at the lock entry's `cptest_mount` (docs/containers.md, "cptest is mounted, not baked in"),
so that the image pins the runtime and changes only when an input does.

`images/lock.json` holds the entry: the inputs, the layer's diff id, the digest. `build` checks this
machine's inputs against the entry before building and the digest after (a RunError, exit 3, names
what differs); `build(update_lock=True)` re-pins the entry from this machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from cptest.errors import Problem, RunError
from cptest.image.lock import ImageLock, write_engine_entry
from cptest.outline import Logger

EPOCH = "1970-01-01T00:00:00Z"
DEBIAN_EXCLUDES = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
                   "usr/share/lintian", "usr/share/bug", "usr/share/gdb")
"""Debian paths never copied: documentation and translations, whatever this machine's dpkg
excludes (container hosts often drop them), so that the layer does not depend on it."""
MERGED_USR = ("bin", "lib", "lib64", "sbin")
"""Top-level directories that are links into /usr (Debian's merged /usr); a package path under one
is stored under usr/."""
DEFAULT_CACHE = Path(os.environ.get("CPTEST_IMAGE_CACHE", "~/.cache/cptest/images")).expanduser()
"""Wheels by sha256 (`wheels/<hex>/`) and the archive being built."""


@dataclass(frozen=True)
class Recipe:
    """What an image is made of, as data; `version` changes whenever the code that assembles it does."""

    name: str
    repository: str
    engine: str
    """The engine whose nodes run this image when their plan names none (the lock's `engine`)."""
    version: int
    python: str
    """Python minor version of the interpreter (Debian's python<python>) and of the wheels."""
    debian: tuple[str, ...]
    wheels: tuple[str, ...]
    """Distribution names; their versions are the running environment's when the lock is updated."""
    wheel_excludes: tuple[str, ...]
    """Paths (relative to site-packages) of wheel files not needed at run time."""
    cptest_mount: str
    smoke: str
    """Python code the image must run (with cptest mounted) before it is accepted."""
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1")

    @property
    def site(self) -> str:
        return f"usr/local/lib/python{self.python}/dist-packages"


REFERENCE = Recipe(
    name="reference",
    repository="localhost/cptest-reference",
    engine="reference",
    version=1,
    python="3.11",
    # The interpreter and every library that it, its extension modules and the wheels' shared
    # objects link to (ldd of each, mapped to packages with dpkg -S).
    debian=("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "libgcc-s1",
            "libstdc++6", "zlib1g", "libexpat1", "libssl3", "libffi8", "libbz2-1.0", "liblzma5", "libcrypt1",
            "libdb5.3", "libncursesw6", "libtinfo6", "libnsl2", "libreadline8", "libsqlite3-0", "libtirpc3",
            "libuuid1", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3", "libkrb5support0", "libcom-err2",
            "libkeyutils1"),
    # What cptest.reference imports (torch, numpy, safetensors, setproctitle; pydantic through
    # cptest.evidence) and their requirements, closed over Requires-Dist.
    wheels=("torch", "numpy", "safetensors", "setproctitle", "pydantic", "pydantic-core", "annotated-types",
            "typing-extensions", "typing-inspection", "filelock", "fsspec", "jinja2", "markupsafe",
            "networkx", "sympy", "mpmath", "setuptools"),
    # C++ headers and the C++ test programs: for building extensions and testing torch, 145 MB.
    wheel_excludes=("torch/include/", "torch/test/"),
    cptest_mount="/opt/cptest",
    smoke=("import torch, numpy, safetensors.torch, setproctitle, pydantic, cptest.reference.server, "
           "cptest.reference.rank; print('torch', torch.__version__, 'threads', torch.get_num_threads())"),
)
RECIPES = {REFERENCE.name: REFERENCE}


# --------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Inputs:
    """Everything the layer is made from: Debian packages by version, wheels by sha256, the recipe."""

    debian: dict[str, str]
    """"name:arch" -> Debian version."""
    wheels: dict[str, str]
    """"name==version" -> "sha256:<hex>" of the wheel file."""
    recipe: int

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "debian": dict(sorted(self.debian.items())),
                "wheels": dict(sorted(self.wheels.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> Inputs:
        try:
            return cls(debian=dict(data["debian"]), wheels=dict(data["wheels"]), recipe=int(data["recipe"]))
        except (KeyError, TypeError, ValueError) as e:
            raise RunError(Problem(None, f"{where}: inputs must hold recipe, debian and wheels ({e})",
                                   hint="re-pin: cptest image build reference --update-lock")) from None

    @property
    def sha256(self) -> str:
        return "sha256:" + hashlib.sha256(_canonical(self.to_json())).hexdigest()

    def differences(self, here: Inputs) -> list[str]:
        """What `here` (this machine) has that differs from these (pinned) inputs, one line each."""
        out = []
        if here.recipe != self.recipe:
            out.append(f"recipe version {here.recipe} here, {self.recipe} pinned")
        for what, pinned, found in (("debian package", self.debian, here.debian),
                                    ("wheel", self.wheels, here.wheels)):
            for k in sorted(set(pinned) | set(found)):
                if pinned.get(k) != found.get(k):
                    out.append(f"{what} {k}: {found.get(k) or 'absent'} here, "
                               f"{pinned.get(k) or 'not pinned'} pinned")
        return out


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def _run(argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RunError(Problem(None, f"{what}: {argv[0]} failed ({e})")) from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise RunError(Problem(None, f"{what}: `{' '.join(argv[:4])} ...` exited {done.returncode}: {tail}"))
    return done.stdout


def installed_debian(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """{"name:arch": version} of these packages as dpkg has them installed; RunError naming the absent."""
    bare = sorted({n.split(":")[0] for n in names})
    try:
        fmt = "-f=${Package}:${Architecture}\t${Version}\t${db:Status-Abbrev}\n"
        done = subprocess.run(["dpkg-query", "-W", fmt, *bare], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise RunError(Problem(None, f"dpkg-query is not available here ({e}): the image is made of "
                               "Debian packages", hint="build it on a Debian machine")) from None
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, version, status = (line.split("\t") + ["", ""])[:3]
        if status.strip() == "ii":
            found[key] = version
    missing = [n for n in bare if not any(k.split(":")[0] == n for k in found)]
    if missing:
        raise RunError(Problem(None, f"Debian package(s) not installed here: {', '.join(missing)}",
                               hint=f"apt-get install {' '.join(missing)}"))
    return found


# --------------------------------------------------------------------------------------------------
# The layer's entries


@dataclass(frozen=True)
class Entry:
    """One member of the layer. `source` opens the content of a file (None for dirs and links)."""

    path: str
    kind: str  # "dir", "file", "symlink"
    mode: int
    size: int = 0
    link: str = ""
    source: Callable[[], IO[bytes]] | None = field(default=None, compare=False)
    origin: str = ""
    """Which input it came from (for the message of a conflict)."""


def _canonical_path(dpkg_path: str) -> str:
    rel = dpkg_path.lstrip("/")
    top = rel.split("/", 1)[0]
    return f"usr/{rel}" if top in MERGED_USR else rel


def _excluded(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def debian_entries(package: str) -> Iterator[Entry]:
    """The files of an installed package (`name:arch`), each regular file checked against dpkg."""
    listing = _run(["dpkg-query", "-L", package], f"listing {package}").splitlines()
    sums: dict[str, str] = {}
    control = _run(["dpkg-query", "--control-path", package, "md5sums"], f"{package}'s md5sums").strip()
    if control:
        for line in Path(control).read_text().splitlines():
            digest, _, name = line.partition("  ")
            sums["/" + name.strip()] = digest
    conffiles = _run(["dpkg-query", "-W", "-f=${Conffiles}\n", package], f"{package}'s conffiles")
    for line in conffiles.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("/"):
            sums[parts[0]] = parts[1]
    for dpkg_path in listing:
        if not dpkg_path.startswith("/") or dpkg_path in ("/.", "/"):
            continue
        path = _canonical_path(dpkg_path)
        if _excluded(path, DEBIAN_EXCLUDES):
            continue
        host = Path("/" + path) if os.path.lexists("/" + path) else Path(dpkg_path)
        try:
            st = host.lstat()
        except FileNotFoundError:
            raise RunError(Problem(None, f"{dpkg_path} of Debian package {package} is missing here",
                                   hint=f"apt-get install --reinstall {package.split(':')[0]}")) from None
        if stat.S_ISDIR(st.st_mode):
            yield Entry(path, "dir", 0o755, origin=package)
        elif stat.S_ISLNK(st.st_mode):
            yield Entry(path, "symlink", 0o777, link=os.readlink(host), origin=package)
        elif stat.S_ISREG(st.st_mode):
            expected = sums.get(dpkg_path)
            if expected is None:
                raise RunError(Problem(None, f"{dpkg_path} of {package} has no checksum in dpkg's database, "
                                       "so its bytes cannot be shown to be the package's"))
            if _md5(host) != expected:
                raise RunError(Problem(None, f"{host} differs from Debian package {package} (md5 is not "
                                       f"dpkg's {expected})",
                                       hint=f"apt-get install --reinstall {package.split(':')[0]}")) from None
            yield Entry(path, "file", 0o755 if st.st_mode & 0o111 else 0o644, size=st.st_size,
                        source=lambda h=host: h.open("rb"), origin=package)


def wheel_entries(wheel: Path, site: str, excludes: tuple[str, ...]) -> Iterator[Entry]:
    """The files a wheel installs into site-packages (purelib/platlib), as the wheel holds them."""
    zf = zipfile.ZipFile(wheel)
    for info in zf.infolist():
        name = info.filename
        if name.endswith("/"):
            continue
        parts = name.split("/")
        if parts[0].endswith(".data"):
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue  # scripts, headers, data: nothing the engine runs
            name = "/".join(parts[2:])
        if ".." in name.split("/") or name.startswith("/"):
            raise RunError(Problem(None, f"{wheel.name} holds a path outside site-packages: {info.filename}"))
        if _excluded(name, excludes):
            continue
        executable = (info.external_attr >> 16) & 0o111
        yield Entry(f"{site}/{name}", "file", 0o755 if executable else 0o644, size=info.file_size,
                    source=lambda i=info: zf.open(i), origin=wheel.name)


def fixed_entries(recipe: Recipe) -> Iterator[Entry]:
    """The files no package provides: users, merged-/usr links, `python3`, /tmp, the cptest mount point."""

    def text(path: str, content: str) -> Entry:
        data = content.encode()
        return Entry(path, "file", 0o644, size=len(data), source=lambda: io.BytesIO(data), origin="recipe")

    yield text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                             "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    yield text("etc/group", "root:x:0:\nnogroup:x:65534:\n")
    for top in MERGED_USR:
        yield Entry(top, "symlink", 0o777, link=f"usr/{top}", origin="recipe")
    yield Entry("usr/bin/python3", "symlink", 0o777, link=f"python{recipe.python}", origin="recipe")
    for d in ("tmp",):
        yield Entry(d, "dir", 0o1777, origin="recipe")
    for d in ("root", "proc", "sys", "dev", recipe.cptest_mount.strip("/")):
        yield Entry(d, "dir", 0o755, origin="recipe")


def collect(entries: Iterator[Entry]) -> dict[str, Entry]:
    """Entries by path, with every parent directory; RunError when two inputs disagree on a path."""
    out: dict[str, Entry] = {}
    for e in entries:
        have = out.get(e.path)
        if have is not None:
            same = have.kind == e.kind == "dir" or (have.kind == e.kind == "symlink" and have.link == e.link)
            if have.kind == e.kind == "file" and have.size == e.size and have.source and e.source:
                with have.source() as a, e.source() as b:
                    same = a.read() == b.read()
            if not same:
                raise RunError(Problem(None, f"{e.origin} and {have.origin} both provide /{e.path}, "
                                       "differently"))
            continue
        out[e.path] = e
    for path in list(out):
        parent = path.rpartition("/")[0]
        while parent and parent not in out:
            out[parent] = Entry(parent, "dir", 0o755, origin="implied")
            parent = parent.rpartition("/")[0]
    return out


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.hash, self.bytes = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.hash.update(b)
        self.bytes += len(b)
        return self.out.write(b)


def write_layer(entries: Mapping[str, Entry], out: IO[bytes]) -> tuple[str, int]:
    """The layer tar of `entries` in path order; returns its diff id ("sha256:<hex>") and size."""
    sink = _Hashing(out)
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for path in sorted(entries):
            e = entries[path]
            ti = tarfile.TarInfo(e.path)
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = 0, 0, 0, "", "", e.mode
            if e.kind == "dir":
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            elif e.kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(ti)
            else:
                assert e.source is not None
                ti.size = e.size
                with e.source() as f:
                    tar.addfile(ti, f)
    return "sha256:" + sink.hash.hexdigest(), sink.bytes


def image_config(recipe: Recipe, diff_id: str, inputs: Inputs) -> bytes:
    """The image config, canonical JSON: its sha256 is the image ID."""
    return _canonical({
        "architecture": "amd64", "os": "linux", "created": EPOCH,
        "config": {"Env": list(recipe.env), "Cmd": [f"python{recipe.python}"], "WorkingDir": "/",
                   "Labels": {"cptest.recipe": f"{recipe.name}/{recipe.version}",
                              "cptest.inputs": inputs.sha256}},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": EPOCH,
                     "created_by": f"cptest image build {recipe.name} (recipe {recipe.version})"}],
    })  # fmt: skip


def write_archive(reference: str, config: bytes, layer: Path, out: Path) -> None:
    """A docker-archive (what `docker save` writes) of one layer: `docker load` / `images.load` input."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = _sha256_path(layer) + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": [layer_name]}]).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 0
            tar.addfile(ti, io.BytesIO(data))
        ti = tarfile.TarInfo(layer_name)
        ti.size, ti.mtime = layer.stat().st_size, 0
        with layer.open("rb") as f:
            tar.addfile(ti, f)


def _sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# Wheels


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_key(filename: str) -> str:
    """"name==version" of a wheel file name (PEP 427: name-version-[build-]python-abi-platform.whl)."""
    name, version = filename.split("-")[:2]
    return f"{_norm(name)}=={version}"


def environment_wheels(recipe: Recipe) -> list[str]:
    """"name==version" of each of the recipe's distributions as the running Python has them."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != recipe.python:
        raise RunError(Problem(None, f"re-pinning needs Python {recipe.python} (the image's), this is "
                               f"{sys.version.split()[0]}",
                               hint=f"run cptest from a Python {recipe.python} venv"))
    out, missing = [], []
    for name in recipe.wheels:
        try:
            out.append(f"{_norm(name)}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        raise RunError(Problem(None, f"not installed in this Python: {', '.join(missing)}",
                               hint=f"pip install {' '.join(missing)}"))
    return out


def fetch_wheels(wanted: list[str], pins: Mapping[str, str] | None, cache: Path,
                 log: Logger) -> dict[str, Path]:
    """The wheel file of each "name==version", from the cache or pip (the configured indexes).

    With `pins` every file must have its pinned sha256 (pip checks it, `--require-hashes`), and a
    cached file is found by it; without, whatever pip chooses for this Python is taken.
    """
    store = cache / "wheels"
    found: dict[str, Path] = {}
    if pins is not None:
        for key in wanted:
            d = store / pins[key].removeprefix("sha256:")
            files = sorted(d.glob("*.whl")) if d.is_dir() else []
            if files and _sha256_path(files[0]) == pins[key].removeprefix("sha256:"):
                found[key] = files[0]
    todo = [k for k in wanted if k not in found]
    if todo:
        with log.step(f"fetching {len(todo)} wheel(s) with pip"), tempfile.TemporaryDirectory() as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text("".join(f"{k} --hash={pins[k]}\n" if pins else f"{k}\n" for k in todo))
            _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                  "--dest", str(Path(tmp) / "dl"), "-r", str(req)], "fetching the image's wheels")
            for f in sorted((Path(tmp) / "dl").glob("*.whl")):
                digest = _sha256_path(f)
                target = store / digest / f.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(f), target)
                found[_wheel_key(f.name)] = target
    missing = [k for k in wanted if k not in found]
    if missing:
        raise RunError(Problem(None, f"pip gave no wheel for {', '.join(missing)}"))
    return {k: found[k] for k in wanted}


# --------------------------------------------------------------------------------------------------
# Building, loading, pinning


@dataclass(frozen=True)
class Built:
    reference: str
    digest: str
    layer: str
    """The layer's diff id (sha256 of its tar)."""
    layer_bytes: int
    files: int
    inputs: Inputs
    seconds: float
    loaded: bool
    """False when the engine already held the pinned image and nothing was built."""

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "digest": self.digest, "layer": self.layer,
                "layer_bytes": self.layer_bytes, "files": self.files, "inputs": self.inputs.to_json(),
                "seconds": round(self.seconds, 1), "loaded": self.loaded}


def reference_for(recipe: Recipe, inputs: Inputs) -> str:
    """The image reference: repository and a tag naming the Python and torch it holds."""
    torch = next((k.split("==")[1] for k in inputs.wheels if k.startswith("torch==")), "none")
    return f"{recipe.repository}:py{recipe.python}-torch{re.sub(r'[^A-Za-z0-9_.-]', '-', torch)}"


def build(recipe: Recipe, *, lock_path: Path, client: Any, log: Logger, cache: Path = DEFAULT_CACHE,
          update_lock: bool = False, force: bool = False) -> Built:
    """Make the recipe's image, load it into the engine `client` talks to, run its smoke test.

    Pinned (the default): this machine's Debian packages must be the lock's versions and the wheels
    have the lock's sha256, and the image must come out with the lock's digest; otherwise RunError
    (exit 3) naming each difference, and nothing is loaded. An engine that already holds the pinned
    digest under the reference is left as it is (`force` rebuilds and checks anyway).
    `update_lock`: the inputs are this machine's (its packages, the running Python's versions of the
    wheels) and the lock entry is rewritten with them and the digest.
    """
    t0 = time.monotonic()
    found = ImageLock.load(lock_path).for_engine(recipe.engine)
    if update_lock:
        pinned = None
        wanted = environment_wheels(recipe)
        debian = installed_debian(recipe.debian)
    else:
        if found is None or found.status != "pinned" or found.inputs is None:
            raise RunError(Problem(None, f"{lock_path} pins no {recipe.name} image (an entry with "
                                   f"\"engine\": \"{recipe.engine}\", its inputs and digest)",
                                   hint=f"make one: cptest image build {recipe.name} --update-lock"))
        pinned = Inputs.from_json(found.inputs, f"{lock_path}: images[{found.reference!r}]")
        wanted = sorted(pinned.wheels)
        here = Inputs(debian=installed_debian(list(pinned.debian)), wheels=pinned.wheels,
                      recipe=recipe.version)
        differ = pinned.differences(here)
        if differ:
            raise RunError(Problem(
                None, f"this machine's inputs are not the ones {lock_path} pins for {found.reference}: "
                + "; ".join(differ),
                hint=f"install the pinned versions, or re-pin here (cptest image build {recipe.name} "
                     "--update-lock) and commit the lock",
            ))
        debian = pinned.debian
        if not force and _engine_digest(client, found.reference) == found.digest:
            log.info(f"{found.reference} is already in the engine with the pinned digest {found.digest}")
            return Built(found.reference, str(found.digest), str(found.layer), 0, 0, pinned,
                         time.monotonic() - t0, loaded=False)
    wheels = fetch_wheels(wanted, pinned.wheels if pinned else None, cache, log)
    inputs = pinned or Inputs(debian=debian, recipe=recipe.version,
                              wheels={k: "sha256:" + _sha256_path(p) for k, p in wheels.items()})
    reference = found.reference if (found and not update_lock) else reference_for(recipe, inputs)

    def entries() -> Iterator[Entry]:
        for package in sorted(debian):
            yield from debian_entries(package)
        for key in sorted(wheels):
            yield from wheel_entries(wheels[key], recipe.site, recipe.wheel_excludes)
        yield from fixed_entries(recipe)

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp:
        layer = Path(tmp) / "layer.tar"
        with log.step(f"writing the root filesystem of {reference}"):
            members = collect(entries())
            with layer.open("wb") as out:
                diff_id, size = write_layer(members, out)
        config = image_config(recipe, diff_id, inputs)
        digest = "sha256:" + hashlib.sha256(config).hexdigest()
        log.info(f"layer {diff_id} ({size / 1e6:.0f} MB, {len(members)} entries); image {digest}")
        if found and not update_lock and digest != found.digest:
            raise RunError(Problem(
                None, f"the pinned inputs gave {reference} another image than {lock_path} pins: {digest} "
                f"(layer {diff_id}), pinned {found.digest} (layer {found.layer})",
                hint="the inputs match, so the recipe is not deterministic here: a bug in "
                     "cptest/image/build.py; please report it with both layers' listings (tar -tvf)",
            ))
        archive = Path(tmp) / "image.tar"
        write_archive(reference, config, layer, archive)
        layer.unlink()
        load(client, archive, reference, digest, log)
    smoke(client, recipe, reference, log)
    built = Built(reference, digest, diff_id, size, len(members), inputs, time.monotonic() - t0, loaded=True)
    if update_lock:
        write_lock_entry(lock_path, recipe, built)
        log.info(f"pinned {reference} {digest} in {lock_path}")
    return built


def _engine_digest(client: Any, reference: str) -> str | None:
    import docker.errors

    try:
        return str(client.images.get(reference).id)
    except docker.errors.ImageNotFound:
        return None


def load(client: Any, archive: Path, reference: str, digest: str, log: Logger) -> None:
    """Load the archive through the Docker API; RunError unless the engine then holds `digest` as
    `reference`."""
    import docker.errors
    import requests.exceptions

    with log.step(f"loading {reference} into the container engine ({archive.stat().st_size / 1e6:.0f} MB)"):
        try:
            with archive.open("rb") as f:
                client.images.load(f)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise RunError(Problem(None, f"the container engine refused the image archive: {e}")) from None
    got = _engine_digest(client, reference)
    if got != digest:
        raise RunError(Problem(None, f"after loading, the engine's {reference} is {got}, not the config's "
                               f"digest {digest}", hint="an engine that rewrites configs on load cannot "
                               "keep cptest's pin; use Podman or Docker"))


def smoke(client: Any, recipe: Recipe, reference: str, log: Logger) -> None:
    """Run the recipe's smoke code in a throw-away container with cptest mounted; RunError on failure."""
    import docker.errors
    import requests.exceptions

    from cptest.image.lock import cptest_volume

    with log.step(f"checking that {reference} runs the {recipe.engine} engine's imports"):
        try:
            out = client.containers.run(reference, ["python3", "-c", recipe.smoke], remove=True,
                                        volumes=cptest_volume(recipe.cptest_mount),
                                        environment={"PYTHONPATH": recipe.cptest_mount},
                                        labels={"cptest.launcher": "docker", "cptest.role": "image-smoke"})
        except docker.errors.ContainerError as e:
            err = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-5:]
            raise RunError(Problem(None, f"{reference} cannot run the {recipe.engine} engine: "
                                   + " | ".join(err))) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise RunError(Problem(None, f"the smoke container of {reference} did not run: {e}")) from None
    log.info(out.decode(errors="replace").strip())


def write_lock_entry(lock_path: Path, recipe: Recipe, built: Built) -> None:
    """Pin `built` as the lock's image for the recipe's engine (`lock.write_engine_entry`: other
    entries kept as they are)."""
    write_engine_entry(lock_path, recipe.engine, built.reference, {
        "digest": built.digest,
        "status": "pinned",
        "engine": recipe.engine,
        "build": f"cptest image build {recipe.name} (from the inputs below; docs/containers.md)",
        "cptest_mount": recipe.cptest_mount,
        "layer": built.layer,
        "inputs": built.inputs.to_json(),
    })
