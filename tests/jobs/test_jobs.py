"""Jobs: one active job per key, a finished job is never run again (a re-delivered task), transient
errors are retried and then give up, other errors fail the job with their message; the API is read-only."""
from __future__ import annotations

import pytest
from django.db import OperationalError

from apps.jobs.models import Job
from apps.jobs.services import JobConflict, TransientJobError, job_checkpoint_set, job_create, job_execute, job_progress

pytestmark = pytest.mark.django_db


def test_one_active_job_per_key() -> None:
    first = job_create(kind="planning", key="planning:fleet", actor_name="test")
    with pytest.raises(JobConflict) as info:
        job_create(kind="planning", key="planning:fleet")
    assert info.value.job == first
    job_execute(job_id=first.pk, work=lambda job: {"ok": True})
    again = job_create(kind="planning", key="planning:fleet")  # the first one finished
    assert again.pk != first.pk
    job_create(kind="planning")  # no key: no limit
    job_create(kind="planning")


def test_a_job_that_finishes_between_the_refused_insert_and_the_look_leaves_the_key_free(monkeypatch) -> None:
    """The race CI once met (a 500 to a plan run): the insert is refused because a job holds the key, and that
    job finishes before job_create looks for it. The key is free then, so the new job is created."""
    first = job_create(kind="planning", key="planning:fleet", actor_name="test")
    look = Job.objects.filter
    finished: list[int] = []

    def the_other_finishes_then_look(*args, **kwargs):
        if kwargs.get("key") == "planning:fleet" and not finished:  # job_create looks for the job in the way
            finished.append(look(pk=first.pk).update(status="succeeded"))  # ... which just finished elsewhere
        return look(*args, **kwargs)

    monkeypatch.setattr(Job.objects, "filter", the_other_finishes_then_look)
    second = job_create(kind="planning", key="planning:fleet")
    assert finished == [1] and second.pk != first.pk and second.status == "pending"


def test_execute_runs_once_and_records_the_outcome() -> None:
    job = job_create(kind="planning")
    calls = []

    def work(j: Job) -> dict:
        calls.append(j.attempts)
        job_progress(job_id=j.pk, progress=40, log_line="halfway")
        return {"answer": 42}

    assert job_execute(job_id=job.pk, work=work) == {"answer": 42}
    job.refresh_from_db()
    assert (job.status, job.progress, job.result, job.attempts) == ("succeeded", 100, {"answer": 42}, 1)
    assert "halfway" in job.log and job.started and job.finished
    assert job_execute(job_id=job.pk, work=work) is None  # a duplicate delivery does nothing
    assert calls == [1]


def test_transient_errors_are_retried_then_give_up_and_checkpoints_survive() -> None:
    job = job_create(kind="rollout")

    def flaky(j: Job) -> dict:
        if "solved" not in j.checkpoint:
            job_checkpoint_set(job_id=j.pk, name="solved", value=7)
            raise OperationalError("database went away")
        return {"from_checkpoint": j.checkpoint["solved"]}

    with pytest.raises(OperationalError):
        job_execute(job_id=job.pk, work=flaky, final_attempt=False)
    job.refresh_from_db()
    assert job.status == "running" and "retrying" in job.log
    assert job_execute(job_id=job.pk, work=flaky) == {"from_checkpoint": 7}  # the retry resumes
    job.refresh_from_db()
    assert job.status == "succeeded" and job.attempts == 2

    stuck = job_create(kind="rollout")

    def always(j: Job) -> dict:
        raise TransientJobError("agents unreachable")

    assert job_execute(job_id=stuck.pk, work=always, final_attempt=True) is None
    stuck.refresh_from_db()
    assert stuck.status == "failed" and "gave up after 1 attempts: agents unreachable" in stuck.error


def test_other_errors_fail_the_job_with_their_message() -> None:
    job = job_create(kind="profiling")
    job_execute(job_id=job.pk, work=lambda j: 1 / 0)
    job.refresh_from_db()
    assert job.status == "failed" and job.error.startswith("ZeroDivisionError")


def test_jobs_api_is_read_only_and_hidden_from_agents(clients, agent_hosts) -> None:
    job = job_create(kind="planning", actor_name="test")
    assert clients["viewer"].get(f"/api/v1/jobs/{job.pk}/").json()["status"] == "pending"
    assert clients["operator"].post("/api/v1/jobs/", {}, format="json").status_code in (403, 405)
    assert clients["anonymous"].get("/api/v1/jobs/").status_code == 401
    _hosts, agents = agent_hosts
    assert agents[0].get(f"/api/v1/jobs/{job.pk}/").status_code in (403, 404)


# --- delivery: stale pending jobs, the sweeper, heartbeats (issue 16) ---------------------------------------


def _aged(job: Job, **fields) -> Job:
    """`job` with fields set behind the model's back (created/queued/heartbeat in the past)."""
    Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    return job


def test_a_stale_pending_job_never_blocks_a_new_one(settings) -> None:
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    never_sent = _aged(job_create(kind="planning", key="planning:fleet"), created=now - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S + 5))
    fresh = job_create(kind="planning", key="planning:fleet")  # took the wedged one's place
    never_sent.refresh_from_db()
    assert never_sent.status == "failed" and "never queued" in never_sent.error and "superseded" in never_sent.error
    # A pending job that was sent and is waiting for a worker is not stale: it still blocks.
    _aged(fresh, queued=now, created=now - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S + 5))
    with pytest.raises(JobConflict):
        job_create(kind="planning", key="planning:fleet")
    # ... until it has waited TESSERA_JOB_PENDING_MAX_S.
    _aged(fresh, created=now - timedelta(seconds=settings.TESSERA_JOB_PENDING_MAX_S + 1))
    assert job_create(kind="planning", key="planning:fleet").status == "pending"


def test_the_sweeper_sends_lost_jobs_again_and_fails_expired_ones(settings, monkeypatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from apps.jobs.services import jobs_sweep

    sent: list[int] = []
    monkeypatch.setattr("apps.jobs.services._task_send", lambda task, job_id: sent.append(job_id) or True)
    now, stale = timezone.now(), timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S + 1)
    task = "planning.plan_run"
    never_sent = _aged(job_create(kind="planning"), task=task, created=now - stale)
    just_created = _aged(job_create(kind="planning"), task=task)
    not_taken = _aged(job_create(kind="planning"), task=task, queued=now - timedelta(seconds=settings.TESSERA_JOB_REQUEUE_AFTER_S + 1))
    dead_worker = _aged(job_create(kind="rollout"), task=task, status="running", heartbeat=now - stale, queued=now - 2 * stale)
    beating = _aged(job_create(kind="rollout"), task=task, status="running", heartbeat=now, queued=now - 2 * stale)
    expired = _aged(job_create(kind="profiling"), task=task, created=now - timedelta(seconds=settings.TESSERA_JOB_PENDING_MAX_S + 1))

    done = jobs_sweep()
    assert sorted(sent) == sorted([never_sent.pk, not_taken.pk, dead_worker.pk])
    assert done == {"failed": 1, "pending_sent": 2, "running_sent": 1, "send_failed": 0}
    expired.refresh_from_db()
    assert expired.status == "failed" and "no worker took it" in expired.error
    dead_worker.refresh_from_db()
    assert "stopped beating" in dead_worker.log
    for job in (just_created, beating):
        job.refresh_from_db()
        assert job.status in ("pending", "running") and "sweeper" not in job.log
    sent.clear()
    assert jobs_sweep()["running_sent"] == 0 and sent == []  # sent once, not at every sweep


def test_a_delivery_of_a_job_beating_elsewhere_does_nothing_and_a_stale_one_resumes(settings) -> None:
    from datetime import timedelta

    from django.utils import timezone

    settings.TESSERA_JOB_HEARTBEAT_S = 2.0  # claims record a heartbeat (no thread runs: the work is instant)
    job = _aged(job_create(kind="rollout"), status="running", attempts=1, heartbeat=timezone.now())
    calls = []
    assert job_execute(job_id=job.pk, work=lambda j: calls.append(j.attempts)) is None
    assert calls == []  # the attempt beating elsewhere goes on alone
    _aged(job, heartbeat=timezone.now() - timedelta(seconds=settings.TESSERA_JOB_STALE_AFTER_S + 1))
    job_execute(job_id=job.pk, work=lambda j: calls.append(j.attempts))
    job.refresh_from_db()
    assert calls == [2] and job.status == "succeeded" and job.heartbeat is None


@pytest.mark.django_db(transaction=True)
def test_a_running_attempt_writes_its_heartbeat(settings) -> None:
    import time

    settings.TESSERA_JOB_HEARTBEAT_S = 0.1
    job = job_create(kind="profiling")
    beats = []

    def work(j: Job) -> dict:
        for _ in range(2):
            time.sleep(0.5)
            beats.append(Job.objects.get(pk=j.pk).heartbeat)
        return {}

    job_execute(job_id=job.pk, work=work)
    assert beats[0] is not None and beats[1] > beats[0]
