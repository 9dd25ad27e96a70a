"""The job that benches/faults.py and tests/integration/test_outages.py kill a worker under: `bench.steps`
takes `steps` one-second steps, checkpointing each, so a resumed attempt carries on where the killed one
stopped. A Celery worker loads it with `--include benches.fault_tasks`; nothing in the product queues it."""
from __future__ import annotations

import time

from apps.jobs.models import Job
from apps.jobs.services import job_checkpoint_set, job_progress
from apps.jobs.tasks import job_task

STEP_S = 1.0


@job_task(name="bench.steps", max_retries=3, retry_backoff=1)
def bench_steps_task(self, job_id: int) -> dict | None:
    def work(job: Job) -> dict:
        steps = int(job.params.get("steps", 10))
        done = int(job.checkpoint.get("done", 0))
        for step in range(done, steps):
            time.sleep(STEP_S)
            job_checkpoint_set(job_id=job.pk, name="done", value=step + 1)
            job_progress(job_id=job.pk, progress=int(100 * (step + 1) / steps))
        return {"steps": steps, "attempts": job.attempts}

    return self.job_run(job_id, work)
