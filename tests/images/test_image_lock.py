"""The committed image lock, the SGLang image recipe and cptest's reference-image recipe agree with each
other and with the repo."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path

import pytest

from cptest.errors import RunError
from cptest.image.build import RECIPES, REFERENCE, Inputs, image_config, reference_for
from cptest.image.lock import DEFAULT_LOCK_PATH, ImageLock

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
SGLANG_IMAGE = "sglang-cptest:0.5.17"


def test_the_committed_lock_is_valid_and_every_entry_is_built_from_a_dockerfile_or_cptests_recipe():
    lock = ImageLock.load(DEFAULT_LOCK_PATH)
    assert SGLANG_IMAGE in lock.entries
    raw = json.loads(DEFAULT_LOCK_PATH.read_text())["images"]
    for ref, entry in raw.items():
        if "dockerfile" in entry:
            assert (ROOT / entry["dockerfile"]).is_file(), ref
        else:
            assert entry["engine"] in RECIPES and "inputs" in entry, ref


def test_the_pinned_reference_image_is_what_the_recipe_makes_of_the_pinned_inputs():
    """The digest is the sha256 of the config cptest writes from the layer and the inputs: a lock
    edited by hand, or a recipe changed without re-pinning, fails here before any engine is asked."""
    entry = ImageLock.load(DEFAULT_LOCK_PATH).for_engine("reference")
    assert entry is not None and entry.status == "pinned" and entry.cptest_mount == REFERENCE.cptest_mount
    raw = json.loads(DEFAULT_LOCK_PATH.read_text())["images"][entry.reference]
    inputs = Inputs.from_json(raw["inputs"], "lock")
    assert inputs.recipe == REFERENCE.version, "recipe changed: cptest image build reference --update-lock"
    assert {k.split(":")[0] for k in inputs.debian} == set(REFERENCE.debian)
    assert {k.split("==")[0] for k in inputs.wheels} == set(REFERENCE.wheels)
    assert entry.reference == reference_for(REFERENCE, inputs)
    config = image_config(REFERENCE, raw["layer"], inputs)
    assert entry.digest == "sha256:" + hashlib.sha256(config).hexdigest()


def test_the_unbuilt_sglang_image_is_refused_with_its_build_command():
    with pytest.raises(RunError) as err:
        ImageLock.load().entry(SGLANG_IMAGE)
    text = str(err.value)
    assert "unbuilt" in text and "docker build -f images/Dockerfile.sglang-0.5.17" in text


def test_the_wheel_lock_pins_sglang_0_5_17_and_every_wheel_by_sha256():
    lines = [ln.split() for ln in (IMAGES / "sglang-0.5.17.lock").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 51
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==\S+", ln[0]) and re.fullmatch(r"[0-9a-f]{64}", ln[1])
               for ln in lines)
    assert [ln[0] for ln in lines if ln[0].startswith("sglang==")] == ["sglang==0.5.17"]


def test_the_dockerfile_copies_only_files_that_exist_and_checks_the_probe_entry_point():
    text = (IMAGES / "Dockerfile.sglang-0.5.17").read_text()
    sources = [src for line in re.findall(r"^COPY (.+)$", text, re.MULTILINE)
               for src in line.split()[:-1] if not src.startswith("--") and "[" not in src]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    assert "--require-hashes" in text
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert "cptest_probe" in entry_points["sglang.srt.plugins"]
    assert '"cptest_probe" in names' in text
