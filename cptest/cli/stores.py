"""The stores cptest keeps beside runs: its own images (`image`) and the model store (`models`)."""

from __future__ import annotations

from pathlib import Path

import click

from cptest.cli.common import (
    console_log,
    emit,
    guard,
    json_option,
    models_option,
)


@click.group()
def image() -> None:
    """Images cptest makes itself from pinned inputs (images/lock.json; docs/containers.md)."""


@image.command(name="build")
@click.argument("name", type=click.Choice(["reference"]))
@click.option("--update-lock", is_flag=True,
              help="take the inputs from this machine and re-pin images/lock.json with the new digest")
@click.option("--force", is_flag=True, help="build and check even when the engine holds the pinned image")
@json_option
@guard
def image_build(name: str, update_lock: bool, force: bool, as_json: bool) -> int:
    """Build an image from its pinned inputs, load it into the container engine ($DOCKER_HOST), check
    its digest against images/lock.json and that it runs; exit 3 when anything differs."""
    from cptest.image.build import RECIPES, build
    from cptest.image.lock import lock_path
    from cptest.run.docker import engine_client

    built = build(RECIPES[name], lock_path=lock_path(), client=engine_client(), log=console_log(as_json),
                  update_lock=update_lock, force=force)
    how = (f"built and loaded: {built.layer_bytes / 1e6:.0f} MB, {built.files} entries, {built.seconds:.0f} s"
           if built.loaded else "already in the engine")
    emit(built.to_json(), as_json, f"{built.reference}  {built.digest}  ({how})")
    return 0


@click.group()
def models() -> None:
    """The model store: checkpoints runs and reruns find by name and by tree hash."""


@models.command(name="make")
@click.argument("names", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="every tiny model of the suite")
@models_option
@json_option
@guard
def models_make(names: tuple[str, ...], all_: bool, models: Path | None, as_json: bool) -> int:
    """Write the suite's tiny models (synthetic weights) into the store; `--all` writes every one."""
    from cptest.errors import ScenarioError
    from cptest.run.models import TINY, make_named, store_dir

    wanted = list(TINY) if all_ else list(names)
    unknown = [n for n in wanted if n not in TINY]
    if not wanted or unknown:
        what = f"unknown model {', '.join(unknown)}" if unknown else "no model named"
        raise ScenarioError(f"models make: {what}; expected one of {', '.join(TINY)} or --all")
    store = store_dir(models)
    made = []
    for name in wanted:
        directory, tree = make_named(name, store)
        made.append({"name": name, "directory": str(directory), "tree_sha256": tree})
        if not as_json:
            click.echo(f"{name}  {tree}  {directory}")
    if as_json:
        emit({"store": str(store), "models": made}, True, "")
    return 0


@models.command(name="list")
@models_option
@json_option
@guard
def models_list(models: Path | None, as_json: bool) -> int:
    """The checkpoints in the store, with their tree hashes and the names that link to them."""
    from cptest.run.models import store_dir, store_entries

    store = store_dir(models)
    entries = store_entries(store)
    text = "\n".join(f"{e['name']}  {e['tree_sha256']}  {', '.join(e['aliases'])}".rstrip() for e in entries)
    emit({"store": str(store), "models": entries}, as_json, text or f"(no model in {store})")
    return 0


@models.command(name="add")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@models_option
@json_option
@guard
def models_add(directory: Path, models: Path | None, as_json: bool) -> int:
    """Copy a local checkpoint into the store, where reruns find it by its tree hash."""
    from cptest.errors import Problem, ScenarioError
    from cptest.run.models import add_checkpoint, store_dir

    if not (directory / "config.json").is_file():  # an empty folder would be stored as a "checkpoint"
        raise ScenarioError(Problem(None, f"models add: {directory} holds no checkpoint (no config.json)",
                                    hint="give the folder of a Hugging Face checkpoint"))
    target, tree = add_checkpoint(directory, store_dir(models))
    emit({"directory": str(target), "tree_sha256": tree}, as_json, f"{tree}  {target}")
    return 0


COMMANDS = (image, models)
