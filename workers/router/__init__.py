"""The router: clients' inference requests (KServe v2 over HTTP) to runtime instances, by the control
plane's weighted routing tables (docs/dataplane.md). See `workers.router.app`."""
from workers.router.app import Router, RouterHandle, router_serve, router_start_in_thread

__all__ = ["Router", "RouterHandle", "router_serve", "router_start_in_thread"]
