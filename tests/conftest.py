import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from apps.inventory.services import host_agent_token_rotate
from apps.users.choices import RoleChoices
from apps.users.roles import roles_sync, user_role_set
from apps.users.services import token_create

from .factories import HostFactory, UserFactory

ROLES = (RoleChoices.VIEWER, RoleChoices.OPERATOR, RoleChoices.ADMIN)


def services_required() -> bool:
    """CI sets TESSERA_REQUIRE_SERVICES=1: then a missing PostgreSQL/Redis/worker fails the run instead of
    skipping the tests that need it."""
    return os.environ.get("TESSERA_REQUIRE_SERVICES") == "1"


def xdist_worker_index() -> int:
    """Which pytest-xdist worker this is: N on worker `gwN`, 0 without xdist. `make test` runs two workers;
    pytest-django gives each its own test database (`test_<NAME>_gwN`), and the service-backed tests give
    each its own Redis database (tests/integration/conftest.py), so the two never see each other's rows,
    queues or Celery worker (.ci/run starts one Celery worker per xdist worker)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def service_unavailable(reason: str) -> None:
    if services_required():
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(f"{reason} (set TESSERA_REQUIRE_SERVICES=1 to make this a failure)")


# Each session has a folder of its own (made by the xdist controller, or the one process without xdist; the
# workers inherit its path): the two locks below and the demo's measurements live there.
SESSION_DIR_ENV = "TESSERA_TEST_SESSION_DIR"


def pytest_configure(config):
    if not os.environ.get(SESSION_DIR_ENV):
        folder = tempfile.mkdtemp(prefix="tessera-test-session-")
        os.environ[SESSION_DIR_ENV] = folder
        config.add_cleanup(lambda: (shutil.rmtree(folder, ignore_errors=True), os.environ.pop(SESSION_DIR_ENV, None)))
    # The demo's measurements are kept in the session's folder (the product's TESSERA_DEMO_MEASUREMENTS_DIR): the
    # xdist workers and every process a test starts that seeds the demo (the fault and telemetry benches'
    # control planes) read one measurement instead of each timing the models again.
    os.environ["TESSERA_DEMO_MEASUREMENTS_DIR"] = os.environ[SESSION_DIR_ENV]
    from django.conf import settings

    settings.TESSERA_DEMO_MEASUREMENTS_DIR = os.environ[SESSION_DIR_ENV]
    import controlplane.demo as demo

    demo._cpu_points_measure = _demo_measure_alone(demo._cpu_points_measure)
    _flush_bound_install()


class _Turns:
    """Under xdist, tests that time real work on this machine's cores run alone. Every test holds a shared lock
    while it runs; a `solo` test (and the demo's CPU measurement, below) holds it exclusively, so the other
    worker finishes the test it is in and waits. A gate taken before either keeps a worker that asked for the
    exclusive lock from waiting forever behind the other's next tests."""

    def __init__(self, folder: Path) -> None:
        self.gate = open(folder / "turns-gate", "a")
        self.turns = open(folder / "turns", "a")
        self.held = 0

    def take(self, mode: int) -> None:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.turns, mode)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.held = mode

    def release(self) -> None:
        fcntl.flock(self.turns, fcntl.LOCK_UN)
        self.held = 0

    @contextlib.contextmanager
    def alone(self):
        """Exclusively, within a test that holds the shared lock (released first: two workers that both wait
        for the exclusive lock while holding the shared one would wait for each other)."""
        held = self.held
        if held == fcntl.LOCK_EX:
            yield
            return
        self.release()
        self.take(fcntl.LOCK_EX)
        try:
            yield
        finally:
            self.release()
            if held:
                self.take(held)


_turns: _Turns | None = None


def _turns_of_this_worker() -> "_Turns | None":
    global _turns
    if _turns is None and os.environ.get("PYTEST_XDIST_WORKER"):
        _turns = _Turns(Path(os.environ[SESSION_DIR_ENV]))
    return _turns


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    turns = _turns_of_this_worker()
    if turns is None:
        yield
        return
    turns.take(fcntl.LOCK_EX if item.get_closest_marker("solo") else fcntl.LOCK_SH)
    try:
        yield
    finally:
        turns.release()


# `make test-fast` (-m fast): the inner loop, within two minutes. Everything but what needs a service or a
# browser, starts real processes and servers, seeds the demo (its measurement alone takes half a minute), or runs
# a bench: those run in `make test`.
_NOT_FAST_FIXTURES = {
    "live_server", "asgi_live_server", "browser_page", "celery_worker", "broker", "redis_url", "private_redis_url",
    "postgres", "postgres_server_url", "demo_fleet", "data_plane",
}
_NOT_FAST_PATHS = (
    "integration/", "deploy/", "_browser.py", "bench", "test_demo.py", "test_project.py",
    "api/test_schema_fuzz.py", "engine/test_cli.py", "engine/test_scheduler_training.py",
    "workers/test_agent", "workers/test_with_control_plane.py", "workers/test_router", "workers/test_runtime_server.py",
    "workers/test_metrics_lint.py", "workers/test_resize.py", "security/test_deploy_checks.py",
    "security/test_secrets_not_logged.py", "security/test_audits.py",
)

# Engine and API tests that take seconds each (brute-force comparisons, every serializer's fast path, the
# validator over every solver's plans, schedules at four times the shared rates); and a test named for a bench.
_NOT_FAST_TESTS = {
    "test_joint_matches_brute_force", "test_proteus_matches_brute_force", "test_mip_start_is_used",
    "test_the_fast_path_agrees_with_drf", "test_penalised_plan_never_worse_than_keeping_every_instance",
    "test_every_plan_passes_the_validator", "test_schedules_of_the_shared_profiles_at_four_times_the_rates_are_valid",
    "test_a_six_stage_pipeline_of_six_variants_solves_to_the_optimum_the_milp_walk_finds",
}


# The longest tests (tens of seconds to minutes, from `--durations`), longest first: run first, so that under
# xdist they start on both workers at once (xdist hands out the first quarter of the tests in turn) instead of
# one of them ending the run alone. Solo tests stay where they are: first, they would wait for a long one.
_LONGEST_FIRST = (
    "integration/test_bench_soak_smoke.py", "integration/test_bench_faults_smoke.py", "api/test_schema_fuzz.py", "integration/test_bench_telemetry_smoke.py",
    "engine/test_vertical_bench_smoke.py", "integration/test_outages.py", "engine/test_repro_benches_smoke.py",
    "engine/test_scheduler_training.py", "workers/test_agent.py", "integration/test_slot_move.py", "workers/test_agent_mps.py",
    "test_project.py", "integration/test_serve_processes.py", "workers/test_bench_dataplane_smoke.py",
    "workers/test_with_control_plane.py", "workers/test_app_deploy.py", "workers/test_router_ensembles.py", "workers/test_mps_plan_applied.py",
)


def _longest_first_rank(item) -> int:
    path = item.path.as_posix()
    if not item.get_closest_marker("solo"):
        for rank, part in enumerate(_LONGEST_FIRST):
            if path.endswith(part):
                return rank
    return len(_LONGEST_FIRST)


def _seeds_the_demo(item) -> bool:
    return "demo_fleet" in getattr(item, "fixturenames", ()) or "demo_seed" in getattr(item.module, "__dict__", {})


def pytest_collection_modifyitems(config, items):
    items.sort(key=_longest_first_rank)  # stable: the rest keep their order
    if _turns_of_this_worker() is not None and any(_seeds_the_demo(item) for item in items):
        _demo_measure_before_the_tests()
    for item in items:
        path = item.path.as_posix()
        if (item.get_closest_marker("services") or item.get_closest_marker("solo")
                or getattr(item, "originalname", item.name) in _NOT_FAST_TESTS or "bench" in item.name
                or any(part in path for part in _NOT_FAST_PATHS)
                or _NOT_FAST_FIXTURES & set(getattr(item, "fixturenames", ()))
                or _seeds_the_demo(item)):
            continue
        item.add_marker(pytest.mark.fast)


# The demo seed measures its CPU models on this machine (controlplane/demo.py: about half a minute) and keeps
# what it measured in the session's folder (TESSERA_DEMO_MEASUREMENTS_DIR, set above): the first worker to seed
# the demo measures, alone (the other worker's tests would take the cores it times); the rest read it.
def _demo_measure_alone(measure):
    def alone(onnx_bytes: bytes, cores: int, batches: tuple[int, ...]) -> list[dict]:
        from controlplane import demo

        kept = demo.demo_measurement_path(onnx_bytes, tuple(dict.fromkeys((*demo.DEMO_CPU_PROFILE_CORES, cores))), batches)
        turns = _turns_of_this_worker()
        if (kept is not None and kept.exists()) or turns is None:
            return measure(onnx_bytes, cores, batches)
        with turns.alone():  # the other worker may have measured it while this one waited: then it reads it
            return measure(onnx_bytes, cores, batches)

    alone.__wrapped__ = measure
    return alone


def _demo_measure_before_the_tests() -> None:
    """Under xdist, each worker measures (or reads) what the demo seed will, once it has collected and before
    any test runs: measured later, alone, it would first wait for the test the other worker is in, which may
    be one of the longest. The same models and batch sizes as `_registry_seed`, `_pipeline_seed` and
    `_ensemble_seed` (a model left out here is measured when the seed asks for it)."""
    import inspect

    from controlplane import demo

    every = inspect.signature(demo._cpu_variant_seed).parameters["batches"].default
    models = [*demo.demo_models_build(), demo.demo_calibrator_build(), *demo.demo_ensemble_members_build()]
    turns = _turns_of_this_worker()
    turns.take(fcntl.LOCK_EX)
    try:
        for model in models:
            batches = demo.CONV_PROFILE_BATCHES if model.name == demo.CONV_MODEL_NAME else every
            for cores in demo.DEMO_CPU_PROFILE_CORES:
                demo._cpu_points_measure(model.onnx_bytes, cores, batches)
    finally:
        turns.release()


# The flush that ends every transactional test (`TRUNCATE` of every table) runs under a long statement bound, not
# the request's 4 s (TESSERA_DB_STATEMENT_TIMEOUT_S, the watchdog 0.5 s later). On a loaded two-core CI machine a
# flush failed after tests/workers/test_agent_kubernetes.py (its log kept no cause: waiting on a lock that a live
# server's or Celery worker's last transaction held, or a slow TRUNCATE, are what 4 s cuts short), and the next
# test on that worker started on its rows. Should it fail all the same, the error names the sessions it waited on.
FLUSH_STATEMENT_BOUND_S = 60.0
# The flush after tests/workers/test_agent_kubernetes.py failed once more, with the cause kept this time: PostgreSQL's
# "deadlock detected" between the TRUNCATE (AccessExclusiveLock, table by table) and a router report that the live
# server was still ingesting (its transaction held one table and wanted another). PostgreSQL aborts one side of a
# deadlock so the other can finish; the flush is that side, so it is tried again, as a deadlock victim should be.
FLUSH_DEADLOCK_ATTEMPTS = 5


def _flush_blockers() -> str:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid, state, now() - xact_start, left(query, 200) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
            return "; ".join(f"pid {pid} {state} for {age}: {query}" for pid, state, age, query in cursor.fetchall()) or "none"
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        return f"(could not list them: {exc})"


def _is_deadlock(exc: BaseException) -> bool:
    """Whether PostgreSQL aborted the statement as a deadlock victim (psycopg's DeadlockDetected, SQLSTATE 40P01),
    anywhere in the exception's chain."""
    seen: BaseException | None = exc
    for _ in range(20):  # a chain is short; the bound guards against a cycle
        if seen is None:
            break
        if getattr(seen, "sqlstate", None) == "40P01" or type(seen).__name__ == "DeadlockDetected":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _fixture_teardown_bounded(teardown):
    def bounded(self):
        from django.db import connections

        from apps.core.outages import statement_bound_override

        if not any(connections[alias].vendor == "postgresql" for alias in self._databases_names(include_mirrors=False)):
            return teardown(self)
        for attempt in range(1, FLUSH_DEADLOCK_ATTEMPTS + 1):
            try:
                with statement_bound_override(FLUSH_STATEMENT_BOUND_S):
                    return teardown(self)
            except Exception as exc:
                if _is_deadlock(exc) and attempt < FLUSH_DEADLOCK_ATTEMPTS:
                    time.sleep(0.2 * attempt)
                    continue
                raise RuntimeError(f"the test database could not be flushed (attempt {attempt}); sessions in a transaction on it: "
                                   f"{_flush_blockers()}") from exc

    bounded.__wrapped__ = teardown
    return bounded


def _flush_bound_install() -> None:
    from django.test.testcases import TransactionTestCase

    if not hasattr(TransactionTestCase._fixture_teardown, "__wrapped__"):
        TransactionTestCase._fixture_teardown = _fixture_teardown_bounded(TransactionTestCase._fixture_teardown)


@pytest.fixture
def roles(db):
    roles_sync()


def _user(role: str):
    user = UserFactory(username=role)
    user_role_set(user, role)
    return user


@pytest.fixture
def users(roles):
    return {role: _user(role) for role in ROLES}


def _token_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def clients(users):
    """An API client per principal: anonymous, one per role (with a user API token), and two agents."""
    result = {"anonymous": APIClient()}
    for role, user in users.items():
        _, secret = token_create(user=user, description=f"{role} test token")
        result[role] = _token_client(secret)
    return result


@pytest.fixture
def agent_hosts(db):
    """Two hosts, each with its own agent token, and an API client for each agent."""
    hosts, agent_clients = [], []
    for name in ("agent-host-a", "agent-host-b"):
        host = HostFactory(name=name)
        agent_clients.append(_token_client(host_agent_token_rotate(host=host)))
        hosts.append(host)
    return hosts, agent_clients


@pytest.fixture(autouse=True)
def _throttles_reset():
    """Each test starts with nothing counted by the API's rate limits: the cache (process memory in tests) and
    the addresses this process saw refused (the metrics fast path's memory); their database rows go with the
    test's transaction."""
    from django.core.cache import cache

    from apps.users import services

    cache.clear()
    services._failing_addresses.clear()


@pytest.fixture(autouse=True)
def _media_root(settings, tmp_path):
    """Each test stores files in its own folder, so "nothing left behind" is checkable."""
    settings.MEDIA_ROOT = tmp_path / "media"
