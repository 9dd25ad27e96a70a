"""`tessera`, the command line: the root Typer app, with each command group's module registered on it."""
from __future__ import annotations

# Subcommands that need the database (pipeline, token, ...) set Django up themselves; the engine's subcommands (mig, plan, trace,
# simulate) run without Django. Every module here imports only typer at the top and the engine, Django and
# the data plane inside its commands, so `tessera --help` stays fast and never loads the solvers.
import typer

from . import dataplane, load, server, simulate, tokens
from .app import app_app
from .ensemble import ensemble_app
from .mig import mig_app
from .pipeline import pipeline_app
from .plan import plan_app
from .scheduler import scheduler_app
from .trace import trace_app

app = typer.Typer(help="Tessera: SLO-aware control plane for GPU inference fleets.", no_args_is_help=True)

app.command()(server.demo)
app.command()(server.serve)
app.command()(server.ingest)
app.command()(server.worker)
app.command()(tokens.agent_token)
app.command()(dataplane.agent)
app.command()(dataplane.router)
app.command()(simulate.simulate)
app.command()(load.load)

app.add_typer(tokens.token_app, name="token")
app.add_typer(tokens.router_credential_app, name="router-credential")
app.add_typer(mig_app, name="mig")
app.add_typer(plan_app, name="plan")
app.add_typer(app_app, name="app")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(ensemble_app, name="ensemble")
app.add_typer(trace_app, name="trace")
app.add_typer(scheduler_app, name="scheduler")
