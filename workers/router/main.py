"""`tessera router`: the router wired to the control plane's REST API (routing tables in, reports out), with
the router's own credential (scoped to its name)."""
from __future__ import annotations

from typing import Any, Callable

from workers.client import ControlPlaneClient, ControlPlaneRejected, ControlPlaneUnavailable, ReportBacklog, report_backlog_capacity
from workers.metrics import ReportBacklogCollector

from .app import Router
from .oip import RepositoryActionError
from .server import router_serve

__all__ = ["repository_relay", "router_build", "router_main"]


def router_build(*, control_plane: str, token: str, name: str | None = None, report_s: float = 1.0,
                 grpc_listen: str | None = None) -> tuple[Router, ControlPlaneClient]:
    """A router following the control plane's active routing tables and reporting to it every `report_s`.
    `token` is the router's credential (`tessera router-credential issue NAME`); its name is the
    credential's, asked of the control plane when not given (a report under another name is refused). An
    unreachable control plane at start is fine: the router serves once tables arrive, keeps the last ones
    through outages, and keeps its reports (`ReportBacklog`, `REPORT_BACKLOG_S` of them) to send when the
    control plane is back. `grpc_listen` (HOST:PORT): serve the protocol over gRPC there too."""
    client = ControlPlaneClient(control_plane, token)
    if name is None:
        name = client.router_name()
    backlog = ReportBacklog(client.router_report, capacity=report_backlog_capacity(report_s), what=f"router {name} report")
    router = Router(client.routing_tables, backlog.submit, report_s=report_s, name=name, repository=repository_relay(client),
                    grpc_listen=grpc_listen)
    router.stats.registry.register(ReportBacklogCollector("tessera_router", backlog))
    router.report_backlog = backlog
    return router, client


def repository_relay(client: ControlPlaneClient) -> Callable[..., None]:
    """The router's `repository` callable: a load (with its configuration, if any) or unload relayed to the
    control plane, its refusal (403 not allowed, 400 unknown model or a configuration it cannot apply) or
    absence (503) as `RepositoryActionError`."""

    def relay(action: str, model: str, *, config: Any = None) -> None:
        try:
            client.repository_action(action, model, config=config)
        except ControlPlaneRejected as exc:
            raise RepositoryActionError(exc.status, str(exc).split(": ", 1)[-1]) from None
        except ControlPlaneUnavailable as exc:
            raise RepositoryActionError(503, f"the control plane is unavailable: {exc}") from None

    return relay


def router_main(*, control_plane: str, token: str, host: str, port: int, name: str | None = None, grpc_listen: str | None = None) -> None:
    router, client = router_build(control_plane=control_plane, token=token, name=name, grpc_listen=grpc_listen)
    try:
        router_serve(router, host, port)
    finally:
        client.close()
