"""`tessera router`: the router wired to the control plane's REST API (routing tables in, reports out)."""
from __future__ import annotations

from workers.client import ControlPlaneClient, ControlPlaneError

from .app import Router
from .server import router_serve

__all__ = ["router_build", "router_main"]


def router_build(*, control_plane: str, token: str, name: str | None = None) -> tuple[Router, ControlPlaneClient]:
    """A router following the control plane's active routing tables and reporting to it every second.
    The router's name defaults to its host's (the token's); an unreachable control plane at start is
    fine: the router serves once tables arrive and keeps the last ones through outages."""
    client = ControlPlaneClient(control_plane, token)
    if name is None:
        try:
            name = client.host()["name"]
        except ControlPlaneError:
            name = None  # the socket's hostname
    return Router(client.routing_tables, client.router_report, name=name), client


def router_main(*, control_plane: str, token: str, host: str, port: int, name: str | None = None) -> None:
    router, client = router_build(control_plane=control_plane, token=token, name=name)
    try:
        router_serve(router, host, port)
    finally:
        client.close()
