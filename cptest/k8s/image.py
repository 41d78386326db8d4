"""Which image the pods run: `--image`, else the plan's, else the lock's image for the plan's engine.

SGLang: cptest builds no SGLang image itself: `images/lock.json` names `sglang-cptest:<release>`
(built from images/Dockerfile.sglang-<release>, with cptest installed so that SGLang finds the
probe's entry point), and the docker launcher runs it only once the lock pins its digest.

The reference engine: the lock's entry marked `"engine": "reference"` (`cptest image build
reference`), the image the docker launcher gives a reference node that names none. It holds no
cptest: the entry's `cptest_mount` says where the pods mount cptest's source (the recipe's, for an
image the lock does not know).

A cluster pulls by registry reference, which a local build's tag is not, and the lock's digest may
be a local image ID rather than a registry's manifest digest; so the manifests carry the reference as
given, say whether it is pinned by digest (`cptest/image-pinned`) and what the lock pins for it
(`cptest/image-lock-digest`), and `compile` says what to do when it is not pinned.
"""

from __future__ import annotations

from cptest.errors import CptestError, PlanError, Problem
from cptest.image.build import RECIPES
from cptest.image.lock import ImageLock, lock_path
from cptest.k8s.render import SOURCE_ENGINES, Image, is_pinned
from cptest.plan.model import Plan

SGLANG_IMAGE = "sglang-cptest:{release}"
"""The lock's name for the SGLang image of a release (images/README.md)."""


def resolve(plan: Plan, override: str | None) -> Image:
    """The image of `plan`'s pods. Reads images/lock.json (or $CPTEST_IMAGE_LOCK): what it pins for
    the image, and for the reference engine the image itself and where it expects cptest. A lock that
    cannot be read only changes the note, except for a reference plan naming no image (PlanError:
    only the lock names the reference image)."""
    try:
        lock: ImageLock | None = ImageLock.load(lock_path())
        unreadable = ""
    except CptestError as e:
        lock, unreadable = None, e.problems[0].message
    engine = plan.main.engine
    if override is not None:
        if not override.strip() or any(c.isspace() for c in override):
            raise PlanError(Problem(None, f"--image {override!r} is not an image reference"))
        reference = override
    else:
        named = {n.image for s in plan.servers() for n in s.nodes}
        reference = next(iter(named)) if len(named) == 1 and None not in named else None
    if reference is None and engine in SOURCE_ENGINES:
        entry = lock.for_engine(engine) if lock else None
        if entry is None:
            raise PlanError(Problem(
                None, f"no image for the {engine} engine: "
                f"{unreadable or f'{lock_path()} has no entry for it'}",
                hint=f"build and pin it (cptest image build {engine} --update-lock), or pass --image"))
        reference = entry.reference
    if reference is None:
        reference = SGLANG_IMAGE.format(release=plan.pins.release)
    entry = lock.entries.get(reference) if lock else None
    mount = None
    if engine in SOURCE_ENGINES:
        recipe = RECIPES.get(engine)
        mount = (entry.cptest_mount if entry else None) or (recipe.cptest_mount if recipe else None)
    known = {"lock_digest": entry.digest if entry else None, "cptest_mount": mount}
    if is_pinned(reference):
        return Image(reference, True, **known)
    if override is not None:
        return Image(reference, False, f"--image {override} names no digest: pods may pull different bytes "
                     "over time", **known)
    says = _lock_says(lock, reference)
    return Image(reference, False, f"image {reference} is not pinned by digest ({says}): push it to a "
                 "registry the cluster pulls from and pass --image REGISTRY/NAME@sha256:DIGEST", **known)


def _lock_says(lock: ImageLock | None, reference: str) -> str:
    if lock is None:
        return "no readable image lock"
    entry = lock.entries.get(reference)
    if entry is None:
        return f"{lock_path().name} has no entry for it"
    if entry.status == "unbuilt":
        return f"{lock_path().name} marks it unbuilt"
    return f"{lock_path().name} pins it to {entry.digest}, a local build's ID or a registry digest"
