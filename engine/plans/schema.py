"""JSON Schemas of the problem and plan formats (`schemas/*.schema.json`, draft 2020-12) and a validator
that reports the first faults with the path to them, so that a malformed file is rejected with
"applications[0].slo_ms: -1 is less than or equal to the minimum of 0" rather than a KeyError."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterable

from engine.plans.problem import ProblemError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
# Enough faults to fix several at once, few enough to read.
MAX_REPORTED = 5


class SchemaError(ProblemError):
    """A document does not match its schema; `errors` lists "path: message" lines."""

    def __init__(self, what: str, errors: list[str], total: int) -> None:
        self.errors = errors
        more = f" (and {total - len(errors)} more)" if total > len(errors) else ""
        super().__init__(f"{what} does not match its schema: " + "; ".join(errors) + more)


@functools.lru_cache(maxsize=None)
def _schema_load(name: str) -> dict[str, Any]:
    with (SCHEMA_DIR / name).open() as fh:
        return json.load(fh)


def problem_schema() -> dict[str, Any]:
    return _schema_load("problem.schema.json")


def plan_schema() -> dict[str, Any]:
    return _schema_load("plan.schema.json")


def _path_text(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


@functools.lru_cache(maxsize=None)
def _validator(schema_json: str):  # cached per schema text: building the validator compiles the schema
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def json_validate(instance: Any, schema: dict[str, Any], *, what: str | None = None) -> None:
    """Raise SchemaError naming the path of each fault (at most MAX_REPORTED) if `instance` does not match."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    # Shallowest faults first: a missing required key explains the faults below it.
    faults = sorted(validator.iter_errors(instance), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if faults:
        lines = [f"{_path_text(e.absolute_path)}: {_message(e)}" for e in faults[:MAX_REPORTED]]
        raise SchemaError(what or schema.get("title", "document"), lines, len(faults))


def _message(error: Any) -> str:
    # oneOf failures say only "is not valid under any of the given schemas"; the best sub-error says why.
    if error.validator in ("oneOf", "anyOf") and error.context:
        import jsonschema

        best = jsonschema.exceptions.best_match(error.context)
        return best.message
    return error.message
