"""The router: clients' inference requests (KServe v2 over HTTP) to runtime instances, by the control plane's
weighted routing tables (docs/dataplane.md). Modules: app (HTTP), dispatch, table, upstream, server, main."""
from workers.router.app import Router
from workers.router.server import RouterHandle, router_serve, router_start_in_thread

__all__ = ["Router", "RouterHandle", "router_serve", "router_start_in_thread"]
