"""Which image the pods run: `--image`, else the plan's, else the lock's SGLang image of the release.

cptest builds no SGLang image itself: `images/lock.json` names `sglang-cptest:<release>` (built from
images/Dockerfile.sglang-<release>, with cptest installed so that SGLang finds the probe's entry
point), and the docker launcher runs it only once the lock pins its digest (D44). A cluster pulls by
registry reference, which a local build's tag is not, and the lock's digest may be a local image ID
rather than a registry's manifest digest; so the manifests carry the reference as given, say
whether it is pinned by digest (`cptest/image-pinned`), and `compile` says what to do when it is not.
"""

from __future__ import annotations

from cptest.errors import CptestError, PlanError, Problem
from cptest.k8s.render import Image, is_pinned
from cptest.plan.model import Plan

SGLANG_IMAGE = "sglang-cptest:{release}"
"""The lock's name for the SGLang image of a release (images/README.md)."""


def resolve(plan: Plan, override: str | None) -> Image:
    """The image of `plan`'s pods. Reads images/lock.json (or $CPTEST_IMAGE_LOCK) to say what the
    lock knows of the default; a lock that cannot be read only changes the note."""
    if override is not None:
        if not override.strip() or any(c.isspace() for c in override):
            raise PlanError(Problem(None, f"--image {override!r} is not an image reference"))
        pinned = is_pinned(override)
        return Image(override, pinned, None if pinned else
                     f"--image {override} names no digest: pods may pull different bytes over time")
    named = {n.image for s in plan.servers() for n in s.nodes}
    reference = next(iter(named)) if len(named) == 1 and None not in named else None
    if reference is None:
        reference = SGLANG_IMAGE.format(release=plan.pins.release)
    if is_pinned(reference):
        return Image(reference, True)
    return Image(reference, False, f"image {reference} is not pinned by digest ({_lock_says(reference)}): "
                 "push it to a registry the cluster pulls from and pass --image REGISTRY/NAME@sha256:DIGEST")


def _lock_says(reference: str) -> str:
    from cptest.run.docker import ImageLock, lock_path

    try:
        lock = ImageLock.load(lock_path())
    except CptestError:
        return "no readable image lock"
    entry = lock.entries.get(reference)
    if entry is None:
        return f"{lock_path().name} has no entry for it"
    if entry.status == "unbuilt":
        return f"{lock_path().name} marks it unbuilt"
    return f"{lock_path().name} pins it to {entry.digest}, a local build's ID or a registry digest"
