"""Browser tests that need WebSockets run against Daphne (the production ASGI server) in a child process,
serving the real ASGI application (HTTP and ws/) with static files, on the test database. The child is
forked after the database is seeded; SQLite test databases are files (settings/test.py), so both
processes see the same data."""
from types import SimpleNamespace

import pytest
from django.db import connections


def _asgi_application():
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    from controlplane.asgi import application

    return ASGIStaticFilesHandler(application)  # passes ws/ scopes through to Channels


def _child_setup() -> None:
    """In the forked server: threads do not survive a fork, so nothing the parent's threads ran may be
    reused. asgiref's executor for thread-sensitive sync code (database_sync_to_async in consumers) would
    queue work for a thread that is not there, and hang; channel layers hold the parent's queues."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from channels.layers import channel_layers

    connections.close_all()
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    channel_layers.backends = {}


@pytest.fixture
def asgi_live_server(transactional_db):
    from daphne.testing import DaphneProcess

    connections.close_all()  # the child must open its own connections, not share the parent's sockets
    process = DaphneProcess(host="127.0.0.1", get_application=_asgi_application, setup=_child_setup)
    process.start()
    if not process.ready.wait(20):
        process.terminate()
        detail = process.errors.get(False)[1] if not process.errors.empty() else "no error caught"
        raise RuntimeError(f"Daphne did not start: {detail}")
    server = SimpleNamespace(url=f"http://127.0.0.1:{process.port.value}", process=process)
    try:
        yield server
    finally:
        if process.is_alive():
            process.terminate()
        process.join(10)
