"""`tessera mig`: MIG geometry commands (validate, layouts, export and import of mig-parted configs)."""
from __future__ import annotations

from pathlib import Path

import typer

from ._common import EXIT_INVALID, fail

mig_app = typer.Typer(help="MIG geometry: validate and enumerate layouts, mig-parted config files.", no_args_is_help=True)


def _gpu_model(name: str):
    from engine.geometry.catalogue import mig_catalogue_load

    catalogue = mig_catalogue_load()
    model = catalogue.gpu_model_find(name)
    if model is None:
        raise fail(f"unknown GPU model {name!r} (MIG catalogue: {', '.join(catalogue.gpu_model_names)})")
    return model


def _layout(placements: list[str]):
    from engine.geometry.layout import layout_parse

    try:
        return layout_parse(placements)
    except ValueError as exc:
        raise fail(str(exc)) from exc


@mig_app.command("validate")
def mig_validate_cmd(
    placements: list[str] = typer.Argument(None, help="GPU instances as profile@start, e.g. 3g.20gb@0 2g.10gb@4"),
    gpu: str = typer.Option(..., "--gpu", help="GPU model, e.g. A100-SXM4-40GB (NVML names work too)"),
) -> None:
    """Check a MIG layout: exit 0 when valid, 1 with the reason when not, 2 for an unknown GPU or a malformed placement."""
    from engine.geometry.layout import mig_layout_validate

    model = _gpu_model(gpu)
    layout = _layout(placements or [])
    verdict = mig_layout_validate(model, layout)
    shown = " ".join(map(str, layout)) or "(no instances)"
    if not verdict.valid:
        typer.echo(f"invalid: {verdict.reason}")
        raise typer.Exit(EXIT_INVALID)
    typer.echo(f"valid: {shown} on {model.name}")


@mig_app.command("layouts")
def mig_layouts_cmd(
    gpu: str = typer.Option(..., "--gpu", help="GPU model, e.g. H100-SXM5-80GB"),
    maximal: bool = typer.Option(False, "--maximal", help="Only layouts to which no further instance can be added"),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of layouts"),
) -> None:
    """Every valid MIG layout of a GPU model, one per line (the empty layout prints as '-')."""
    import json

    from engine.geometry.layout import mig_layouts_enumerate

    layouts = mig_layouts_enumerate(_gpu_model(gpu), maximal=maximal)
    if as_json:
        typer.echo(json.dumps([[str(p) for p in layout] for layout in layouts]))
        return
    for layout in layouts:
        typer.echo(" ".join(map(str, layout)) or "-")


@mig_app.command("export")
def mig_export_cmd(
    placements: list[str] = typer.Argument(None, help="GPU instances as profile@start (none: MIG on, no instances)"),
    gpu: str = typer.Option(..., "--gpu", help="GPU model"),
    name: str = typer.Option("tessera", "--name", help="Name of the mig-parted config"),
    devices: str = typer.Option("all", "--devices", help="'all' or comma-separated GPU indices"),
    mig_off: bool = typer.Option(False, "--mig-off", help="Disable MIG on the devices instead"),
    out: Path = typer.Option(None, "--out", help="Write the config.yaml here instead of printing it"),
) -> None:
    """Write a layout as a mig-parted config.yaml (version v1); the exact placements ride along as a comment."""
    from engine.geometry.layout import InvalidLayout
    from engine.geometry.migparted import mig_parted_export

    model = _gpu_model(gpu)
    layout = None if mig_off else _layout(placements or [])
    try:
        targets = "all" if devices.strip() == "all" else tuple(int(d) for d in devices.split(","))
        text = mig_parted_export({name: [(model, layout, targets)]})
    except InvalidLayout as exc:
        typer.echo(f"invalid: {exc}")
        raise typer.Exit(EXIT_INVALID) from exc
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}")


@mig_app.command("import")
def mig_import_cmd(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="mig-parted config.yaml"),
    gpu: str = typer.Option(None, "--gpu", help="Also place each entry's instance counts on this GPU model"),
) -> None:
    """Read a mig-parted config.yaml: per config and entry, the devices and instance counts (and, with
    --gpu, a concrete layout for those counts)."""
    from engine.geometry.catalogue import UnknownMigProfile
    from engine.geometry.layout import mig_counts_to_layout
    from engine.geometry.migparted import MigPartedError, mig_parted_import

    try:
        configs = mig_parted_import(config.read_text())
    except MigPartedError as exc:
        raise fail(str(exc)) from exc
    model = _gpu_model(gpu) if gpu else None
    unplaceable = False
    for cname, entries in configs.items():
        typer.echo(f"{cname}:")
        for entry in entries:
            devices = entry.devices if entry.devices == "all" else ",".join(map(str, entry.devices))
            if not entry.mig_enabled:
                typer.echo(f"  devices {devices}: MIG disabled")
                continue
            counts = ", ".join(f"{n} x {p}" for p, n in entry.counts.items()) or "no instances"
            line = f"  devices {devices}: {counts}"
            if model is not None:
                try:
                    layout = mig_counts_to_layout(model, entry.counts)
                except (UnknownMigProfile, ValueError) as exc:
                    layout, line = None, f"{line} -> {exc}"
                if layout is not None:
                    line += " -> " + (" ".join(map(str, layout)) or "(no instances)")
                elif "->" not in line:
                    line += f" -> does not fit on {model.name}"
                unplaceable = unplaceable or layout is None
            typer.echo(line)
    if unplaceable:
        raise typer.Exit(EXIT_INVALID)
