"""Pipelines in the router: a query sent to `POST /v1/pipelines/{name}/infer` goes stage to stage along one
of the pipeline's execution paths, each stage an application served by its own routing table.

The pipelines come with the routing tables: every stage's table carries its pipeline (name, stages and
paths, as declared in the control plane), so the router holds a pipeline exactly when it holds tables for
it; `pipelines_from_apps` collects them after each refresh (the newest table's copy wins).

A query takes the path its `X-Tessera-Path` header names, else the pipeline's first path. Its deadline is
its arrival plus the path's SLO (or `X-Tessera-Deadline-Ms`, when sooner), and each stage is dispatched
with what is left of it (the runtime orders its queue by that deadline where EDF is configured). The
thesis's drop rule (P3 §p3.4.5): a query whose deadline has passed before a stage is dropped there, with
504 `deadline_exceeded` naming the stage, and never reaches the later stages. Between stages the previous
answer's outputs become the next request's inputs: by the stage's declared mapping (`inputs`: this
stage's input -> the previous stage's output), else each output under its own name. Requests are KServe
v2 JSON (the binary extension is refused with 400 here: the router reads every intermediate answer).

Not done yet, stated: a query follows one path; a DAG whose stage joins the outputs of several branches
for one query (fan-in) is not run, only paths that join in the graph (queries of different paths meeting
at a shared stage, as FA2 plans them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import orjson

__all__ = ["PipelineError", "RouterPipeline", "pipelines_from_apps", "stage_request_build"]


class PipelineError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class RouterPipeline:
    name: str
    stages: Mapping[str, Mapping[str, str]]  # application -> its input mapping (input -> previous output)
    paths: Mapping[str, tuple[tuple[str, ...], float]]  # path -> (stages, slo_ms)
    first_path: str

    def path(self, name: str | None) -> tuple[str, tuple[str, ...], float]:
        chosen = name or self.first_path
        found = self.paths.get(chosen)
        if found is None:
            raise PipelineError(404, "unknown_path", f"pipeline {self.name!r} has no path {chosen!r} (its paths: {', '.join(self.paths)})")
        return chosen, found[0], found[1]


def _pipeline_parse(doc: Any) -> RouterPipeline:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ValueError("a pipeline needs a name")
    stages = {}
    for s in doc.get("stages") or []:
        inputs = s.get("inputs") or {}
        if not isinstance(s.get("application"), str) or not isinstance(inputs, dict):
            raise ValueError(f"pipeline {doc['name']}: a stage needs an application and an inputs object")
        stages[s["application"]] = {str(k): str(v) for k, v in inputs.items()}
    paths = {}
    for q in doc.get("paths") or []:
        route = tuple(q.get("stages") or ())
        slo = q.get("slo_ms")
        if not route or not all(s in stages for s in route) or isinstance(slo, bool) or not isinstance(slo, (int, float)) or slo <= 0:
            raise ValueError(f"pipeline {doc['name']}: path {q.get('name')!r} is malformed")
        paths[str(q.get("name"))] = (route, float(slo))
    if not paths:
        raise ValueError(f"pipeline {doc['name']} has no paths")
    return RouterPipeline(doc["name"], stages, paths, next(iter(paths)))


def pipelines_from_apps(apps: Mapping[str, Any]) -> dict[str, RouterPipeline]:
    """The pipelines the held tables carry (`Application.table["pipeline"]`), the newest table's copy of each;
    one that does not parse is left out (its stages stay servable on their own)."""
    docs: dict[str, tuple[int, dict]] = {}
    for app in apps.values():
        doc = app.table.get("pipeline")
        if isinstance(doc, dict) and isinstance(doc.get("name"), str):
            held = docs.get(doc["name"])
            if held is None or app.version > held[0]:
                docs[doc["name"]] = (app.version, doc)
    out = {}
    for name, (_version, doc) in docs.items():
        try:
            out[name] = _pipeline_parse(doc)
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def output_asks_split(body: bytes) -> tuple[bytes, dict]:
    """A pipeline request's body -> (the body for the first stage, what the client asked of the answer).
    What the client asks of the outputs (`outputs`, `parameters.binary_data_output`: which, and as binary
    data) is asked of the last stage only: the stages between answer in JSON, which the next stage's
    request is built from. A body that asks nothing is returned as it is, unparsed."""
    if b'"outputs"' not in body and b"binary_data_output" not in body:
        return body, {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, {}  # the first stage's runtime says what is wrong with it
    if not isinstance(doc, dict):
        return body, {}
    asks: dict = {}
    if "outputs" in doc:
        asks["outputs"] = doc.pop("outputs")
    params = doc.get("parameters")
    if isinstance(params, dict) and "binary_data_output" in params:
        asks["parameters"] = {"binary_data_output": params.pop("binary_data_output")}
    return orjson.dumps(doc), asks


def stage_request_build(answer_body: bytes, mapping: Mapping[str, str], *, stage: str, previous: str, asks: Mapping | None = None) -> bytes:
    """The next stage's request from the previous stage's JSON answer: its outputs as inputs, renamed by
    `mapping` (this stage's input -> the previous stage's output) or under their own names; `asks` (the
    client's `outputs` and `parameters`, see `output_asks_split`) for the last stage."""
    try:
        answer = orjson.loads(answer_body)
        outputs = {o["name"]: o for o in answer["outputs"]}
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise PipelineError(502, "upstream_error", f"{previous} answered something that is not a KServe v2 JSON answer: {exc}") from None
    if mapping:
        missing = sorted(out for out in mapping.values() if out not in outputs)
        if missing:
            raise PipelineError(502, "pipeline_mapping", f"stage {stage} takes {missing} from {previous}, whose answer has only "
                                                         f"{sorted(outputs)}; fix the pipeline's inputs mapping")
        pairs = [(name, outputs[out]) for name, out in mapping.items()]
    else:
        pairs = [(name, o) for name, o in outputs.items()]
    inputs = [{"name": name, "datatype": o.get("datatype"), "shape": o.get("shape"), "data": o.get("data")} for name, o in pairs]
    return orjson.dumps({"inputs": inputs, **(asks or {})})
