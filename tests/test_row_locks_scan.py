"""No row lock over a join (issue 44): `select_for_update()` on a query that also joins another table (a
`select_related`, a filter, ordering or values across a relation) locks the joined rows too, FOR UPDATE
applying to every table in the FROM clause. That is how a profiling request's progress once locked its
host and deadlocked with an agent's report holding the host (commit 14d8c3c: a 503 to the agent). Such a
query must say which rows it locks (`of=("self",)`, or the tables meant). `update_or_create`, which locks
with select_for_update and cannot say `of`, must not join either.

The code is read, not run (the AST of every module under apps/ and controlplane/): a query chain written in
one expression (`Model.objects.select_related(...).select_for_update()...`) is checked whole, its model
resolved by name to tell a relation (`host__name`) from a lookup or a JSON key (`at__lt`, `params__kind`).
A queryset built in steps through variables is not followed."""
from __future__ import annotations

import ast
from pathlib import Path

import django
from django.apps import apps
from django.db import models

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("apps", "controlplane")

LOCKING = {"select_for_update", "update_or_create"}
# Query methods whose keyword names or string arguments are field paths.
PATHS_IN_KEYWORDS = {"filter", "exclude", "get", "get_or_create", "update_or_create", "Q"}
PATHS_IN_STRINGS = {"order_by", "values", "values_list", "distinct", "F", "only", "defer"}


def _lookup_names() -> set[str]:
    """Every lookup and transform Django registers on a field class (exact, lt, isnull, date, year, ...)."""
    names: set[str] = set()
    for field_class in {type(f) for model in apps.get_models() for f in model._meta.get_fields()} | {models.Field}:
        if hasattr(field_class, "get_class_lookups"):
            names |= set(field_class.get_class_lookups())
    return names


def _models_by_name() -> dict[str, type[models.Model] | None]:
    by_name: dict[str, type[models.Model] | None] = {}
    for model in apps.get_models():
        by_name[model.__name__] = None if model.__name__ in by_name else model  # None: ambiguous
    return by_name


def _joins(model: type[models.Model] | None, path: str, lookups: set[str]) -> bool:
    """Whether the field path `path` (a keyword of filter(), a string of order_by()) needs a join from `model`."""
    parts = path.lstrip("-").split("__")
    if len(parts) < 2:
        return False
    if model is None:  # unknown model: anything that is not a lookup reads as a relation
        return parts[1] not in lookups
    try:
        field = model._meta.get_field(parts[0])
    except Exception:  # noqa: BLE001 - "pk", an annotation's name: no join of its own
        return False
    if not field.is_relation:
        return False  # a lookup, a transform or a JSON key on the model's own column
    related_pk = field.related_model._meta.pk.name if field.related_model else "id"
    return parts[1] not in lookups | {"pk", "id", related_pk}


def _chain(node: ast.AST) -> list[ast.Call]:
    """The calls of one method chain, innermost first (`A.objects.x(...).y(...)`: x, y)."""
    calls: list[ast.Call] = []
    while True:
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func
        elif isinstance(node, ast.Attribute):
            node = node.value
        else:
            return calls[::-1]


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _root_model(call: ast.Call, by_name: dict) -> type[models.Model] | None:
    node = call.func
    while isinstance(node, (ast.Attribute, ast.Call)):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return by_name.get(node.id) if isinstance(node, ast.Name) else None


def _paths(call: ast.Call) -> list[str]:
    """The field paths one call of the chain names, Q(...) and F(...) inside it included."""
    name, found = _name(call), []
    if name in PATHS_IN_KEYWORDS:
        found += [k.arg for k in call.keywords if k.arg]
    if name in PATHS_IN_STRINGS:
        found += [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    for inner in ast.walk(ast.Module(body=[ast.Expr(a) for a in (*call.args, *(k.value for k in call.keywords))], type_ignores=[])):
        if isinstance(inner, ast.Call) and _name(inner) in {"Q", "F"}:
            found += _paths(inner)
    return found


def locks_over_joins(source: str, lookups: set[str], by_name: dict) -> list[tuple[int, str]]:
    """(line, why) for every query chain in `source` that locks rows and joins without saying which rows."""
    tree = ast.parse(source)
    continued = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a chain's inner links
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in continued:
            continue
        calls = _chain(node)
        locking = [c for c in calls if _name(c) in LOCKING and not any(k.arg == "of" for k in c.keywords)]
        if not locking:
            continue
        model = _root_model(calls[0], by_name)
        why = [f"select_related({', '.join(ast.unparse(a) for a in c.args) or 'every foreign key'})"
               for c in calls if _name(c) == "select_related"]
        why += [f"{_name(c)}({path})" for c in calls for path in _paths(c) if _joins(model, path, lookups)]
        if why:
            found.append((locking[0].lineno, f"{_name(locking[0])} without of= over a join: {', '.join(why)}"))
    return found


def test_no_row_lock_over_a_join() -> None:
    lookups, by_name = _lookup_names(), _models_by_name()
    offenders = []
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, why in locks_over_joins(path.read_text(), lookups, by_name):
                offenders.append(f"{path.relative_to(REPO)}:{line}: {why}")
    assert offenders == [], "lock only the rows meant (of=('self',)):\n" + "\n".join(offenders)


def test_the_scan_finds_the_pattern_it_is_for() -> None:
    """The scan itself, on the query of commit 14d8c3c and its neighbours (else an empty answer proves nothing)."""
    assert django.VERSION >= (5, 0)
    lookups, by_name = _lookup_names(), _models_by_name()

    def found(code: str) -> list[str]:
        return [why for _, why in locks_over_joins(code, lookups, by_name)]

    assert found('ProfilingRequest.objects.select_for_update().select_related("host", "variant__application").get(pk=1)')
    assert found('Host.objects.select_related().select_for_update(no_key=True).get(pk=1)')  # every foreign key
    assert found('RuntimeSample.objects.select_for_update().filter(host__name="a")')
    assert found('RuntimeSample.objects.filter(Q(host__status="online") | Q(pk=1)).select_for_update()')
    assert found('RuntimeSample.objects.select_for_update().order_by("-host__name")')
    assert found('Unknown.objects.select_for_update().filter(owner__name="a")')  # an unknown model: read as a relation
    assert found('RuntimeSample.objects.select_related("host").update_or_create(runtime_key="k", defaults={})')
    assert not found('ProfilingRequest.objects.select_for_update(of=("self",)).select_related("host").get(pk=1)')
    assert not found('RuntimeSample.objects.select_for_update().filter(host=h, at__lt=t, host__pk=1, host_id=2).order_by("pk")')
    assert not found('Job.objects.select_for_update().filter(params__kind="x", created__date=d)')  # a JSON key, a transform
    assert not found('Host.objects.select_related("zone").filter(pk=1)')  # no lock
