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
    gpu: str = typer.Option(None, "--gpu", help="GPU model (with placements)"),
    plan_id: int = typer.Option(None, "--plan", help="Export a stored plan instead: one config per host (GET /api/v1/plans/)"),
    name: str = typer.Option("tessera", "--name", help="Name of the mig-parted config (with --gpu)"),
    devices: str = typer.Option("all", "--devices", help="'all' or comma-separated GPU indices (with --gpu)"),
    device_filter: bool = typer.Option(False, "--device-filter", help="Apply only to the model's boards (its PCI device ids)"),
    mig_off: bool = typer.Option(False, "--mig-off", help="Disable MIG on the devices instead"),
    out: Path = typer.Option(None, "--out", help="Write the config.yaml here instead of printing it"),
) -> None:
    """Write a layout (--gpu and placements) or a stored plan's MIG geometry (--plan) as a mig-parted
    config.yaml (version v1) that `nvidia-mig-parted apply` takes; the exact placements ride along as
    comments. With --plan: one config per host, and the node label nvidia.com/mig.config=<config> to set on
    each (NVIDIA's MIG manager applies the config its node's label names)."""
    if (gpu is None) == (plan_id is None):
        raise fail("give either --gpu (and placements) or --plan")
    if plan_id is not None:
        if placements:
            raise fail("--plan takes no placements: the plan's layouts are exported")
        _plan_export(plan_id, out)
        return
    from engine.geometry.layout import InvalidLayout
    from engine.geometry.migparted import MigPartedExportEntry, mig_parted_export

    model = _gpu_model(gpu)
    layout = None if mig_off else _layout(placements or [])
    try:
        targets = "all" if devices.strip() == "all" else tuple(int(d) for d in devices.split(","))
        text = mig_parted_export({name: [MigPartedExportEntry(model, layout, targets, device_filter or None)]})
    except InvalidLayout as exc:
        typer.echo(f"invalid: {exc}")
        raise typer.Exit(EXIT_INVALID) from exc
    except ValueError as exc:
        raise fail(str(exc)) from exc
    _write(text, out)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        typer.echo(f"wrote {out}")


def _plan_export(plan_id: int, out: Path | None) -> None:
    from ._common import django_setup

    django_setup()
    from apps.planning.mig_export import plan_mig_parted_export
    from apps.planning.models import Plan

    plan = Plan.objects.filter(pk=plan_id).first()
    if plan is None:
        raise fail(f"no plan {plan_id}")
    try:
        export = plan_mig_parted_export(plan=plan)
    except ValueError as exc:
        raise fail(f"plan {plan_id}: {exc}") from exc
    _write(export.text, out)
    if out is not None:
        for line in export.label_lines():
            typer.echo(f"label {line}")
        for note in export.notes:
            typer.echo(f"note: {note}")


_STATUS_TEXT = {"filtered_out": "not for this board", "not_for_model": "for other GPUs", "does_not_fit": "CANNOT APPLY"}


@mig_app.command("import")
def mig_import_cmd(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="mig-parted config.yaml"),
    gpu: str = typer.Option(None, "--gpu", help="Resolve each config on this GPU model and place its instance counts"),
    config_name: str = typer.Option(None, "--config", help="Only this config (the name a node label would select)"),
    pci_id: str = typer.Option(None, "--pci-id", help="The board's PCI device id (0xDDDDVVVV), where the model's boards differ"),
) -> None:
    """Read a mig-parted config.yaml: per config and entry, the devices and instance counts. With --gpu,
    which entries apply to that GPU model (device-filter against its PCI device ids, profile names against
    its profiles) and a concrete layout for each. Exit 1 when an entry that applies cannot be placed (or
    the --config named has no entry for the GPU), 2 for a malformed file or unknown GPU."""
    from engine.geometry.migparted import MigPartedError, mig_parted_import, mig_parted_resolve

    try:
        configs = mig_parted_import(config.read_text())
    except MigPartedError as exc:
        raise fail(str(exc)) from exc
    if config_name is not None:
        if config_name not in configs:
            raise fail(f"no config {config_name!r} in {config} (configs: {', '.join(configs)})")
        configs = {config_name: configs[config_name]}
    model = _gpu_model(gpu) if gpu else None
    if model is None and pci_id is not None:
        raise fail("--pci-id needs --gpu")
    failed = False
    for cname, entries in configs.items():
        typer.echo(f"{cname}:")
        if model is None:
            for entry in entries:
                typer.echo(f"  {_entry_text(entry)}")
            continue
        try:
            targets = mig_parted_resolve(entries, model, device_id=pci_id)
        except (MigPartedError, ValueError) as exc:
            raise fail(f"{cname}: {exc} (--pci-id)") from exc
        for target in targets:
            line = f"  {_entry_text(target.entry)}"
            if target.status == "applies":
                if target.entry.mig_enabled:
                    line += " -> " + (" ".join(map(str, target.layout)) or "(no instances)")
            else:
                line += f" -> {_STATUS_TEXT[target.status]}: {target.reason}"
            typer.echo(line)
        failed = failed or any(t.status == "does_not_fit" for t in targets)
        if config_name is not None and not any(t.status == "applies" for t in targets):
            typer.echo(f"  no entry of {cname} applies to {model.label}")
            failed = True
    if failed:
        raise typer.Exit(EXIT_INVALID)


def _entry_text(entry) -> str:
    devices = entry.devices if entry.devices == "all" else ",".join(map(str, entry.devices))
    board = f" [{', '.join(entry.device_filter)}]" if entry.device_filter else ""
    if not entry.mig_enabled:
        return f"devices {devices}{board}: MIG disabled"
    counts = ", ".join(f"{n} x {p}" for p, n in entry.counts.items()) or "no instances"
    return f"devices {devices}{board}: {counts}"
