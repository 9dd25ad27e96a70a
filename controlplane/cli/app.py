"""`tessera app deploy`: put an ONNX model into service over the REST API, as CI would, in one guided flow.

    tessera app deploy classify-new --model resnet.onnx --slo-ms 50 --expected-rps 20 --apply

The steps, each printed as it goes, each a REST call of `/api/v1/` (docs/api.md) with an operator's token
(`--token` or TESSERA_TOKEN) against `--url` (or TESSERA_URL):

1. upload the artifact, unless one with the same SHA-256 is stored (checked by onnx.checker and onnxruntime:
   a model Tessera cannot load stops here, and nothing is created);
2. the application (created, with the model's inputs as its input spec, or the existing one by name);
3. its SLO policy: the p99 target and the expected demand every plan sizes it for until routers observe
   more (apps/planning/demand.py), created or updated;
4. the variant (created, or the existing one of that name moved to this artifact);
5. profiling on the fleet's agents (one request per device type an agent can measure), followed to its end;
6. a plan run, followed to its end: the plan, its status and whether it serves the new application;
7. with `--apply`: the plan approved and rolled out, followed until the agents converge.

Re-running continues where it stopped: each step finds what an earlier run made by name. When a step fails,
the command says which and why (the API's message: no agent can profile the model, the plan leaves demand
unserved, a host did not converge), exits non-zero, and that step has changed nothing; what earlier steps
made stays, so a fix and a re-run go on from there. Exit 0 done, 1 a step failed, 2 bad arguments, 3 the plan
leaves the application's demand (or another's) unserved."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import typer

from ._common import EXIT_INVALID, fail

app_app = typer.Typer(help="Applications: put a model into service over the REST API.", no_args_is_help=True)

EXIT_SHORTFALL = 3
STEPS = 7
JOB_DONE = ("succeeded", "failed")


class StepFailed(Exception):
    """A step of the flow failed: `message` says what is missing."""


class _Api:
    """The control plane's REST API with a bearer token; every error answer becomes a StepFailed naming it."""

    def __init__(self, url: str, token: str, timeout_s: float) -> None:
        import httpx

        self.base = url.rstrip("/") + "/api/v1"
        self.client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def call(self, method: str, path: str, *, expect: tuple[int, ...] = (200, 201, 202), **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.client.request(method, self.base + path, **kwargs)
        except httpx.HTTPError as exc:
            raise StepFailed(f"{method} {path}: the control plane at {self.base} did not answer: {exc}") from exc
        if response.status_code not in expect:
            raise StepFailed(f"{method} {path}: {response.status_code} {_error_text(response)}")
        return response.json() if response.content else None

    def one(self, path: str, **params: Any) -> dict | None:
        """The first object a list answers for `params`, or None."""
        page = self.call("GET", path, params=params)
        results = page.get("results", page) if isinstance(page, dict) else page
        return results[0] if results else None

    def job_follow(self, job: dict, *, what: str, timeout_s: float, echo) -> dict:
        """Poll a job to its end, printing its new log lines; StepFailed if it fails or outlasts `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        printed = 0
        while True:
            lines = (job.get("log") or "").splitlines()
            for line in lines[printed:]:
                echo(f"      {line}")
            printed = len(lines)
            if job.get("status") in JOB_DONE:
                break
            if time.monotonic() > deadline:
                raise StepFailed(f"{what}: job {job['id']} still {job.get('status')} after {timeout_s:g} s; follow it at /api/v1/jobs/{job['id']}/")
            time.sleep(0.5)
            job = self.call("GET", f"/jobs/{job['id']}/")
        if job["status"] != "succeeded":
            raise StepFailed(f"{what}: job {job['id']} failed: {job.get('error') or 'see its log'}")
        return job


def _error_text(response) -> str:
    try:
        error = response.json().get("error", {})
    except ValueError:
        return response.text[:300]
    return str(error.get("message") or error)[:600]


def _numbers(text: str | None, what: str) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise fail(f"{what}: expected whole numbers separated by commas, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise fail(f"{what}: expected whole numbers >= 1, got {text!r}")
    return values


@app_app.command("deploy")
def app_deploy(
    name: str = typer.Argument(..., help="The application's name (created if it does not exist)"),
    model: Path = typer.Option(..., "--model", help="The ONNX model file"),
    slo_ms: float = typer.Option(..., "--slo-ms", help="The p99 latency target in ms"),
    expected_rps: float = typer.Option(None, "--expected-rps", help="Demand to plan for until routers observe more (req/s)"),
    variant: str = typer.Option(None, "--variant", help="The variant's name (default: the model file's name without .onnx)"),
    accuracy: float = typer.Option(1.0, "--accuracy", help="The variant's accuracy, 0..1 (what accuracy scaling trades)"),
    accuracy_metric: str = typer.Option("as given to tessera app deploy", "--accuracy-metric", help="What the accuracy measures, e.g. 'ImageNet top-1'"),
    task: str = typer.Option("other", "--task", help="A new application's task (image-classification, other, ...)"),
    device_types: str = typer.Option(None, "--device-types", help="Profile on these device types only, comma-separated (default: every one an agent can measure)"),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help="Profile these batch sizes, e.g. 1,2,4,8 (default: the service's)"),
    cpu_threads: str = typer.Option(None, "--cpu-threads", help="Profile CPU models at these thread counts, e.g. 1,2"),
    string_length: int = typer.Option(None, "--string-length", help="A text model: characters of each string element the profiler feeds "
                                                                   "(default: the service's); its latency depends on it"),
    apply: bool = typer.Option(False, "--apply", help="Approve the plan and roll it out (else it waits for an operator's approval)"),
    solver: str = typer.Option(None, "--solver", help="The plan run's planner (default: the control plane's)"),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds each of profiling, planning and rollout may take"),
    url: str = typer.Option(None, "--url", help="The control plane (default: TESSERA_URL, else http://127.0.0.1:8000)"),
    token: str = typer.Option(None, "--token", help="An operator's API token (default: TESSERA_TOKEN)"),
) -> None:
    """Upload, validate, profile and plan a model (and with --apply approve and roll out the plan) in one flow
    over the REST API; see the module docstring for the steps and exit codes."""
    token = token or os.environ.get("TESSERA_TOKEN", "")
    if not token:
        raise fail("give an operator's API token: --token or TESSERA_TOKEN (tessera token create --user operator)")
    if not model.is_file():
        raise fail(f"--model {model}: no such file")
    if not slo_ms > 0:
        raise fail(f"--slo-ms must be positive, got {slo_ms:g}")
    if expected_rps is not None and expected_rps < 0:
        raise fail(f"--expected-rps must be >= 0, got {expected_rps:g}")
    if not 0 <= accuracy <= 1:
        raise fail(f"--accuracy must be within 0..1, got {accuracy:g}")
    if not timeout > 0:
        raise fail(f"--timeout must be positive, got {timeout:g}")
    if string_length is not None and string_length < 1:
        raise fail(f"--string-length must be >= 1, got {string_length}")
    batches, threads = _numbers(batch_sizes, "--batch-sizes"), _numbers(cpu_threads, "--cpu-threads")
    types = [t.strip() for t in device_types.split(",") if t.strip()] if device_types else None
    variant_name = variant or model.name.removesuffix(".onnx")
    # A call may run its job before it answers (embedded services run jobs in the request): the same bound.
    api = _Api(url or os.environ.get("TESSERA_URL") or "http://127.0.0.1:8000", token, timeout_s=timeout)
    try:
        short = _deploy(api, name=name, model=model, slo_ms=slo_ms, expected_rps=expected_rps, variant_name=variant_name, accuracy=accuracy,
                        accuracy_metric=accuracy_metric, task=task, device_types=types, batch_sizes=batches, cpu_threads=threads,
                        string_length=string_length, apply=apply, solver=solver, timeout_s=timeout)
    except StepFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    if short:
        raise typer.Exit(EXIT_SHORTFALL)


def _step(n: int, text: str) -> None:
    typer.echo(f"[{n}/{STEPS}] {text}")


def _deploy(api: _Api, *, name: str, model: Path, slo_ms: float, expected_rps: float | None, variant_name: str, accuracy: float,
            accuracy_metric: str, task: str, device_types: list[str] | None, batch_sizes: list[int] | None, cpu_threads: list[int] | None,
            string_length: int | None = None, apply: bool, solver: str | None, timeout_s: float) -> bool:
    """The flow; returns True when the plan leaves demand unserved."""
    import hashlib

    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    artifact = api.one("/artifacts/", sha256=digest)
    if artifact is None:
        _step(1, f"uploading {model.name}")
        with model.open("rb") as handle:
            artifact = api.call("POST", "/artifacts/", files={"file": (model.name, handle, "application/octet-stream")})
    else:
        _step(1, f"{model.name} is stored already (artifact {artifact['id']})")
    typer.echo(f"      artifact {artifact['id']}: sha256 {artifact['sha256'][:12]}, inputs "
               + ", ".join(f"{i['name']} {i.get('dtype')} {i.get('shape')}" for i in artifact.get("inputs", [])))

    application = api.one("/applications/", name=name)
    if application is None:
        _step(2, f"creating application {name}")
        application = api.call("POST", "/applications/", json={"name": name, "task": task, "input_spec": artifact.get("inputs", []),
                                                                "description": f"Deployed with tessera app deploy from {model.name}."})
    else:
        _step(2, f"application {name} exists (id {application['id']})")

    policy = api.one("/slo-policies/", application=application["id"])
    slo = {"latency_p99_ms": slo_ms, **({"expected_rps": expected_rps} if expected_rps is not None else {})}
    if policy is None:
        _step(3, f"SLO policy: p99 <= {slo_ms:g} ms" + (f", planned for {expected_rps:g} req/s until more is observed" if expected_rps else ""))
        policy = api.call("POST", "/slo-policies/", json={"application": application["id"], **slo})
    else:
        _step(3, f"SLO policy {policy['id']} updated: p99 <= {slo_ms:g} ms" + (f", expected {expected_rps:g} req/s" if expected_rps is not None else ""))
        policy = api.call("PATCH", f"/slo-policies/{policy['id']}/", json=slo)

    existing = api.one("/variants/", application=application["id"], name=variant_name)
    body = {"accuracy": accuracy, "accuracy_metric": accuracy_metric, "artifact": artifact["id"]}
    if existing is None:
        _step(4, f"creating variant {variant_name}")
        variant = api.call("POST", "/variants/", json={"application": application["id"], "name": variant_name, **body})
    else:
        _step(4, f"variant {variant_name} exists (id {existing['id']}): now on artifact {artifact['id']}")
        variant = api.call("PATCH", f"/variants/{existing['id']}/", json=body)

    _step(5, "profiling on the fleet's agents")
    request = {k: v for k, v in {"device_types": device_types, "batch_sizes": batch_sizes, "cpu_threads": cpu_threads,
                                 "string_length": string_length}.items() if v}
    started = api.call("POST", f"/variants/{variant['id']}/profile/", json=request)
    for skipped in started.get("skipped", []):
        typer.echo(f"      skipped: {skipped}")
    api.job_follow(started["job"], what="profiling", timeout_s=timeout_s, echo=typer.echo)
    profiles = api.call("GET", "/profiles/", params={"variant": variant["id"], "limit": 1})
    count = profiles.get("count", 0) if isinstance(profiles, dict) else len(profiles)
    if not count:
        raise StepFailed(f"profiling: the job succeeded but {variant_name} has no profile; nothing can plan it")
    typer.echo(f"      {count} profile points")

    _step(6, "planning the fleet")
    job = api.call("POST", "/plan-runs/", json={"solver": solver} if solver else {}, expect=(202,))
    api.job_follow(job, what="the plan run", timeout_s=timeout_s, echo=typer.echo)
    plan = api.one("/plans/", job=job["id"])
    if plan is None:
        raise StepFailed(f"the plan run (job {job['id']}) stored no plan")
    plan = api.call("GET", f"/plans/{plan['id']}/")
    served = (plan.get("result") or {}).get("served_rps", {}).get(name, 0.0)
    typer.echo(f"      plan {plan['id']}: {plan['status']} ({plan.get('solver')}, {plan.get('solver_status')}), "
               f"{name} served {served:.4g} req/s")
    if plan["status"] != "validated":
        raise StepFailed(f"plan {plan['id']} is {plan['status']}: " + "; ".join((plan.get("notes") or [])[:3]))
    shortfall = {k: v for k, v in (plan.get("shortfall") or {}).items() if v}
    if not served:
        raise StepFailed(f"plan {plan['id']} gives {name} no capacity: " + "; ".join(n for n in plan.get("notes", []) if name in n)[:600])

    if not apply:
        _step(7, f"plan {plan['id']} waits for an operator's approval (or re-run with --apply)")
    else:
        _step(7, f"approving and rolling out plan {plan['id']}")
        api.call("POST", f"/plans/{plan['id']}/approve/")
        rollout = api.call("POST", f"/plans/{plan['id']}/apply/", expect=(202,))
        api.job_follow(rollout, what="the rollout", timeout_s=timeout_s, echo=typer.echo)
        typer.echo(f"      plan {plan['id']} is active: {name} is in service")
    if shortfall:
        typer.echo("SHORTFALL    " + ", ".join(f"{k} {v:.4g} req/s" for k, v in shortfall.items()) + " unserved")
    return bool(shortfall)


__all__ = ["app_app"]
