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
