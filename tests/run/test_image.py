"""The reference image's recipe: a layer whose bytes are a function of the inputs, an image ID that is
the sha256 of a config holding no fact of the machine, inputs checked before anything is built."""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.image import build as image
from cptest.image.build import REFERENCE, Entry, Inputs, collect, image_config, wheel_entries, write_layer
from cptest.outline import Logger

INPUTS = Inputs(debian={"libc6:amd64": "2.36-9+deb12u14"}, wheels={"numpy==2.4.6": "sha256:" + "ab" * 32},
                recipe=1)


def file(path: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(path, "file", mode, size=len(data), source=lambda: io.BytesIO(data), origin="test")


def layer_bytes(entries: list[Entry]) -> bytes:
    out = io.BytesIO()
    write_layer(collect(iter(entries)), out)
    return out.getvalue()


ENTRIES = [file("usr/bin/tool", b"#!x\n", 0o755), file("usr/lib/a.so", b"\x7fELF"),
           file("etc/passwd", b"root\n"),
           Entry("usr/lib/b.so", "symlink", 0o777, link="a.so", origin="test"),
           Entry("tmp", "dir", 0o1777, origin="test")]


def test_the_layer_is_the_same_bytes_whatever_order_the_inputs_come_in():
    shuffled = ENTRIES[:]
    random.Random(3).shuffle(shuffled)
    assert layer_bytes(ENTRIES) == layer_bytes(shuffled)


def test_layer_members_are_sorted_with_their_parents_owned_by_root_and_dated_at_the_epoch():
    with tarfile.open(fileobj=io.BytesIO(layer_bytes(ENTRIES))) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) == ["etc", "etc/passwd", "tmp", "usr", "usr/bin", "usr/bin/tool", "usr/lib",
                                      "usr/lib/a.so", "usr/lib/b.so"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    modes = {m.name: m.mode for m in members}
    assert (modes["usr/bin/tool"], modes["usr/lib/a.so"], modes["usr"], modes["tmp"]) == \
        (0o755, 0o644, 0o755, 0o1777)


def test_two_inputs_that_give_one_path_different_contents_are_refused():
    with pytest.raises(RunError, match="both provide /usr/lib/a.so, differently"):
        collect(iter([file("usr/lib/a.so", b"one"), file("usr/lib/a.so", b"two")]))
    assert len(collect(iter([file("usr/lib/a.so", b"one"), file("usr/lib/a.so", b"one")]))) == 3


def make_wheel(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            zf.writestr(info, data)
    return path


def test_a_wheel_installs_purelib_and_platlib_and_leaves_out_scripts_and_excluded_paths(tmp_path: Path):
    wheel = make_wheel(tmp_path, {"demo/__init__.py": b"", "demo/_c.so": b"\x7fELF", "demo/include/h.h": b"",
                                  "demo-1.0.data/platlib/demo_ext.so": b"\x7fELF",
                                  "demo-1.0.data/scripts/demo": b"#!python",
                                  "demo-1.0.dist-info/RECORD": b""})
    got = {e.path: e.mode for e in wheel_entries(wheel, "site", ("demo/include/",))}
    assert got == {"site/demo/__init__.py": 0o644, "site/demo/_c.so": 0o755, "site/demo_ext.so": 0o755,
                   "site/demo-1.0.dist-info/RECORD": 0o644}


def test_a_wheel_path_outside_site_packages_is_refused(tmp_path: Path):
    wheel = make_wheel(tmp_path, {"../../etc/cron.d/x": b""})
    with pytest.raises(RunError, match="outside site-packages"):
        list(wheel_entries(wheel, "site", ()))


def test_the_image_id_is_the_sha256_of_a_config_that_names_only_the_recipe_the_layer_and_the_inputs():
    layer = "sha256:" + "cd" * 32
    config = json.loads(image_config(REFERENCE, layer, INPUTS))
    assert config["created"] == "1970-01-01T00:00:00Z" and config["rootfs"]["diff_ids"] == [layer]
    assert config["config"]["Labels"] == {"cptest.recipe": "reference/1", "cptest.inputs": INPUTS.sha256}
    assert image_config(REFERENCE, layer, INPUTS) == image_config(REFERENCE, layer, INPUTS)
    other = Inputs(INPUTS.debian, {"numpy==2.4.6": "sha256:" + "ef" * 32}, 1)
    assert image_config(REFERENCE, layer, other) != image_config(REFERENCE, layer, INPUTS)


def test_input_differences_name_each_package_and_wheel_with_both_versions():
    here = Inputs({"libc6:amd64": "2.36-9+deb12u15", "libssl3:amd64": "3.0.17"}, INPUTS.wheels, 2)
    assert INPUTS.differences(here) == [
        "recipe version 2 here, 1 pinned",
        "debian package libc6:amd64: 2.36-9+deb12u15 here, 2.36-9+deb12u14 pinned",
        "debian package libssl3:amd64: 3.0.17 here, not pinned pinned",
    ]


def write_lock(tmp_path: Path, entry: dict | None) -> Path:
    images: dict = {"sglang-cptest:0.5.17": {"digest": None, "status": "unbuilt"}}
    if entry is not None:
        images["localhost/cptest-reference:x"] = entry
    path = tmp_path / "lock.json"
    path.write_text(json.dumps({"lock_version": 1, "images": images}))
    return path


def test_a_lock_without_an_image_for_the_engine_is_refused_saying_how_to_pin_one(tmp_path: Path):
    with pytest.raises(RunError, match="pins no reference image") as err:
        image.build(REFERENCE, lock_path=write_lock(tmp_path, None), client=None, log=Logger())
    assert "cptest image build reference --update-lock" in err.value.render()


def test_inputs_that_differ_from_the_lock_stop_the_build_before_anything_is_fetched(tmp_path, monkeypatch):
    entry = {"digest": "sha256:" + "00" * 32, "status": "pinned", "engine": "reference",
             "inputs": INPUTS.to_json()}
    monkeypatch.setattr(image, "installed_debian", lambda names: {"libc6:amd64": "2.36-9+deb12u15"})
    monkeypatch.setattr(image, "fetch_wheels", lambda *a, **k: pytest.fail("fetched wheels"))
    with pytest.raises(RunError) as err:
        image.build(REFERENCE, lock_path=write_lock(tmp_path, entry), client=None, log=Logger())
    text = err.value.render()
    assert "libc6:amd64: 2.36-9+deb12u15 here, 2.36-9+deb12u14 pinned" in text and "--update-lock" in text


def test_re_pinning_replaces_the_engines_entry_and_keeps_the_others(tmp_path: Path):
    lock = write_lock(tmp_path, {"digest": "sha256:" + "00" * 32, "status": "pinned", "engine": "reference"})
    built = image.Built("localhost/cptest-reference:y", "sha256:" + "11" * 32, "sha256:" + "22" * 32, 1, 1,
                        INPUTS, 1.0, loaded=True)
    image.write_lock_entry(lock, REFERENCE, built)
    images = json.loads(lock.read_text())["images"]
    assert sorted(images) == ["localhost/cptest-reference:y", "sglang-cptest:0.5.17"]
    assert images["localhost/cptest-reference:y"] | {"build": None} == {
        "digest": built.digest, "status": "pinned", "engine": "reference", "build": None,
        "cptest_mount": "/opt/cptest", "layer": built.layer, "inputs": INPUTS.to_json()}


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-query") is None,
                                reason="not a Debian machine (no dpkg-query)")


@needs_dpkg
def test_a_debian_package_gives_its_own_files_under_the_merged_usr_without_documentation():
    pkg = next(iter(image.installed_debian(["libc6"])))
    entries = {e.path: e for e in image.debian_entries(pkg)}
    assert entries["usr/lib/x86_64-linux-gnu/libc.so.6"].kind == "file"
    assert not any(p.startswith(("lib/", "usr/share/doc/")) for p in entries)


@needs_dpkg
def test_a_debian_file_that_is_not_the_packages_bytes_is_refused(monkeypatch):
    pkg = next(iter(image.installed_debian(["libc6"])))
    monkeypatch.setattr(image, "_md5", lambda path: "0" * 32)
    with pytest.raises(RunError, match="differs from Debian package libc6"):
        list(image.debian_entries(pkg))
