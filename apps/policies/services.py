"""Policy services: the one way a policy is changed, from the REST API (the viewsets' perform_update) and
the dashboard's Policies page alike (and for ensemble policies the CLI and the admin). Each takes typed values (the API's serializer or the page's form
parses the input), checks them with the model's `full_clean()` (field validators and `clean()`: the one
place a policy's invariants live) and saves in one transaction. Saving is what the rest follows from: the
audit record (apps/core/signals.py) and, for a re-planning policy, its django-celery-beat schedule
(apps/planning/signals.py, `triggers.replan_schedule_sync`), written in the same transaction."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, models, transaction

from apps.core.context import change_context, change_context_current
from apps.registry.models import Application, ModelVariant
from engine.ensembles.policy import EnsembleError, ensemble_policy_from_dict

from .models import EnsembleMember, EnsemblePolicy, ProfilingPolicy, ReplanPolicy, SloPolicy, ensemble_error_as_validation

PolicyT = TypeVar("PolicyT", SloPolicy, ReplanPolicy, ProfilingPolicy)


def policy_editable_fields(model: type[models.Model]) -> frozenset[str]:
    """The fields a policy update may set: the model's editable concrete fields (not its id, not the
    `created` / `last_updated` timestamps)."""
    return frozenset(f.name for f in model._meta.concrete_fields if f.editable and not f.primary_key)


def _policy_update(policy: PolicyT, data: Mapping[str, Any]) -> PolicyT:
    unknown = sorted(set(data) - policy_editable_fields(type(policy)))
    if unknown:
        raise ValueError(f"{type(policy).__name__} has no editable field {', '.join(unknown)}")
    with transaction.atomic():
        for name, value in data.items():
            setattr(policy, name, value)
        policy.full_clean()
        policy.save()
    return policy


def slo_policy_update(*, policy: SloPolicy, data: Mapping[str, Any]) -> SloPolicy:
    """Set an SLO policy's fields (latency target, minimum accuracy, priority, drop rule, expected demand,
    scale to zero, application) from `data`, validate and save. Raises django ValidationError (by field) and saves nothing when the
    values are refused."""
    return _policy_update(policy, data)


def replan_policy_update(*, policy: ReplanPolicy, data: Mapping[str, Any]) -> ReplanPolicy:
    """Set a re-planning policy's fields from `data`, validate and save; its periodic re-plan
    ("replan:<name>") is rescheduled, enabled or disabled in the same transaction. Raises django
    ValidationError (by field) and changes nothing when the values are refused."""
    return _policy_update(policy, data)


def profiling_policy_update(*, policy: ProfilingPolicy, data: Mapping[str, Any]) -> ProfilingPolicy:
    """Set a profiling policy's fields from `data`, validate (lists normalised: names stripped, numbers
    sorted) and save. Raises django ValidationError (by field) and saves nothing when refused."""
    return _policy_update(policy, data)


# --------------------------------------------------------------------------- ensemble policies

ENSEMBLE_POLICY_KEYS = ("mode", "members", "min_size", "max_size", "vote", "scheduler")


@contextmanager
def _acting(actor: Any) -> Iterator[None]:
    """Changes made inside are audited as `actor`'s: within the current change context when it already acts
    for them (a request by that user), else in one of the actor's own (the source kept)."""
    current = change_context_current()
    if actor is None or (current is not None and current.actor() == actor):
        yield
        return
    with change_context(principal=actor, source=current.source if current is not None else "system"):
        yield


def _variant_resolve(ref: Any, variants: list[ModelVariant], application: Application, where: str) -> ModelVariant:
    """A member's variant, given as a ModelVariant, its id or its name, among `application`'s variants
    (matched here rather than queried: any text or number a client sends is only compared)."""
    if isinstance(ref, ModelVariant):
        found = next((v for v in variants if v.pk == ref.pk), None)
    elif isinstance(ref, int) and not isinstance(ref, bool):
        found = next((v for v in variants if v.pk == ref), None)
    elif isinstance(ref, str) and ref:
        found = next((v for v in variants if v.name == ref), None)
    else:
        raise ValidationError({"members": [f"{where}.variant: a variant of {application.name} by id or name is needed, got {ref!r}"]})
    if found is None:
        known = ", ".join(sorted(v.name for v in variants)) or "none"
        raise ValidationError({"members": [f"{where}.variant: {ref if not isinstance(ref, ModelVariant) else ref.name!r} is not a variant of "
                                           f"{application.name} (its variants: {known})"]})
    return found


def _members_read(raw: Any, variants: list[ModelVariant], application: Application) -> list[tuple[ModelVariant, dict[str, Any]]]:
    """Members as [{variant, probability, weight}] or {variant name: probability | {probability, weight}}."""
    if isinstance(raw, Mapping):
        items = [(ref, spec if isinstance(spec, Mapping) else {"probability": spec}) for ref, spec in raw.items()]
    elif isinstance(raw, (list, tuple)):
        items = []
        for i, m in enumerate(raw):
            if not isinstance(m, Mapping) or "variant" not in m:
                raise ValidationError({"members": [f"members[{i}]: expected {{variant, probability, weight}}"]})
            items.append((m["variant"], {k: v for k, v in m.items() if k != "variant"}))
    else:
        raise ValidationError({"members": ["expected a list of {variant, probability, weight} (variant by id or name)"]})
    return [(_variant_resolve(ref, variants, application, f"members[{i}]"), spec) for i, (ref, spec) in enumerate(items)]


def ensemble_members_parse(text: str) -> list[dict[str, Any]]:
    """Members as people type them (the CLI's --member, the dashboard's form): VARIANT=PROBABILITY[:WEIGHT],
    one per line or separated by commas; the variant by name, or by id as a whole number. ValidationError
    under `members` naming the first one it cannot read."""
    members = []
    for item in (part.strip() for line in text.splitlines() for part in line.split(",")):
        if not item:
            continue
        variant, sep, numbers = item.rpartition("=")
        probability, _, weight = numbers.partition(":")
        try:
            member = {"variant": variant.strip(), "probability": float(probability), **({"weight": float(weight)} if weight else {})}
        except ValueError:
            member = None
        if not sep or member is None or not member["variant"]:
            raise ValidationError({"members": [f"{item!r}: expected VARIANT=PROBABILITY or VARIANT=PROBABILITY:WEIGHT, e.g. resnet50=0.4:2"]})
        if member["variant"].isdigit():
            member["variant"] = int(member["variant"])
        members.append(member)
    return members


def ensemble_members_text(policy: EnsemblePolicy) -> str:
    """A policy's members as `ensemble_members_parse` reads them, one per line (numbers written exactly)."""
    return "\n".join(f"{m.variant.name}={m.probability!r}:{m.weight!r}" for m in policy.member_list())


def ensemble_policy_data(policy: EnsemblePolicy) -> dict[str, Any]:
    """A policy as `ensemble_policy_set` takes it (members by variant name): what a partial update starts from."""
    return {
        "mode": policy.mode, "min_size": policy.min_size, "max_size": policy.max_size, "vote": policy.vote, "scheduler": policy.scheduler,
        "members": [{"variant": m.variant.name, "probability": m.probability, "weight": m.weight} for m in policy.member_list()],
    }


def ensemble_policy_read(*, application: Application, data: Mapping[str, Any]) -> EnsemblePolicy:
    """The policy `data` declares for `application`, checked and unsaved (its members in `members_pending`),
    or ValidationError by field. `data`: {mode, members, min_size, max_size, vote, scheduler}, members as
    [{variant, probability, weight}] or {variant: probability}, variants by id or name; left out: mode
    random, vote soft, min_size 1, max_size every member with a probability > 0 (1 for single), weight 1.
    The rules are the engine's (`ensemble_policy_from_dict`), whose messages are reported under their field."""
    if not isinstance(data, Mapping):
        raise ValidationError("An ensemble policy is an object: {mode, members, min_size, max_size, vote, scheduler}.")
    unknown = sorted(set(data) - set(ENSEMBLE_POLICY_KEYS))
    if unknown:
        raise ValidationError({NON_FIELD_ERRORS: [f"unknown keys: {', '.join(map(str, unknown))}"]})
    variants = list(application.variants.all())
    members = _members_read(data.get("members"), variants, application)
    raw = {k: v for k, v in data.items() if k != "members" and not (k == "scheduler" and v in ("", None))}
    raw["members"] = [{"variant": variant.name, **spec} for variant, spec in members]
    try:
        engine = ensemble_policy_from_dict(raw, variants=[v.name for v in variants])
    except EnsembleError as exc:
        raise ensemble_error_as_validation(exc, min_size=raw.get("min_size")) from None
    policy = EnsemblePolicy(application=application, mode=engine.mode, min_size=engine.min_size, max_size=engine.max_size,
                            vote=engine.vote, scheduler=engine.scheduler or "")
    policy.members_pending = [
        EnsembleMember(variant=variant, probability=float(m.probability), weight=float(m.weight))
        for (variant, _spec), m in zip(members, engine.members)
    ]
    return policy


@transaction.atomic
def ensemble_policy_set(*, application: Application, data: Mapping[str, Any], actor: Any = None) -> EnsemblePolicy:
    """Create `application`'s ensemble policy from `data` (see `ensemble_policy_read`), or replace the one it
    has: every field, and the members as a whole. Validated (the engine's rules, the members variants of
    the application) and saved in one transaction; the audit record, by `actor` (or the current change
    context's), carries the fields and the members before and after. Raises ValidationError by field and
    changes nothing on bad input."""
    read = ensemble_policy_read(application=application, data=data)
    policy = EnsemblePolicy.objects.select_for_update().filter(application=application).first() or EnsemblePolicy(application=application)
    for name in ("mode", "min_size", "max_size", "vote", "scheduler"):
        setattr(policy, name, getattr(read, name))
    policy.members_pending = read.members_pending
    try:
        policy.full_clean(validate_unique=False)
        with _acting(actor):
            policy.save()
        policy.members.all().delete()
        for member in policy.members_pending:
            member.policy = policy
        EnsembleMember.objects.bulk_create(policy.members_pending)
    except IntegrityError as exc:  # a concurrent create for the same application got there first
        raise ValidationError({"application": [f"{application.name} has an ensemble policy already ({exc})."]}) from exc
    finally:
        policy.members_pending = None
    return policy


@transaction.atomic
def ensemble_policy_delete(*, policy: EnsemblePolicy, actor: Any = None) -> None:
    """Delete an application's ensemble policy and its members (audited, members included): its queries
    are answered by one variant each again."""
    with _acting(actor):
        policy.delete()
