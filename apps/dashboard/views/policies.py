"""Policies: each application's SLO and ensemble policy, the re-planning and the profiling policies;
operators edit them.

A form here only parses the typed text into values; the policy's service (apps/policies/services.py, the
one the REST API's updates use) validates them with the model and saves, so an edit made on this page has
the same effect as the same edit through the API (audit record, re-planning schedule)."""
from __future__ import annotations

from dataclasses import dataclass, field

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.text import capfirst

from apps.core.context import change_context
from apps.policies.choices import EnsembleModeChoices, EnsembleVoteChoices
from apps.policies.models import EnsemblePolicy
from apps.policies.services import (
    ensemble_members_parse,
    ensemble_members_text,
    ensemble_policy_delete,
    ensemble_policy_set,
    profiling_policy_update,
    replan_policy_update,
    slo_policy_update,
)

from ..selectors import (
    POLICY_KINDS,
    application_colour,
    application_queryset_for,
    ensembles_overview,
    policies_overview,
    policy_model,
    policy_queryset_for,
)
from .common import _require

VIEW_PERMS = (*(f"policies.view_{policy_model(kind)._meta.model_name}" for kind in POLICY_KINDS), "policies.view_ensemblepolicy")


class ListField(forms.CharField):
    """A JSON list of names or whole numbers, typed as comma-separated values (empty: an empty list)."""

    def __init__(self, *, whole_numbers: bool = False, **kwargs):
        self.whole_numbers = whole_numbers
        kwargs["required"] = False
        super().__init__(**kwargs)

    def prepare_value(self, value):
        return ", ".join(str(v) for v in value) if isinstance(value, list) else value

    def to_python(self, value):
        items = [item.strip() for item in (super().to_python(value) or "").split(",") if item.strip()]
        if not self.whole_numbers:
            return items
        try:
            return [int(item) for item in items]
        except ValueError:
            raise ValidationError("Enter whole numbers separated by commas.", code="invalid") from None


def _form_class(model: type[models.Model], fields: list[str], labels: dict[str, str], whole_number_lists=(), optional=()) -> type[forms.Form]:
    """A plain form over the model's fields (no model validation: the service does that on save). An
    `optional` field left out of a submission keeps the policy's value (a field added after the form was
    first drawn, or a client that posts only what it knows)."""

    def formfield(model_field, **kwargs):
        if isinstance(model_field, models.JSONField):
            return ListField(whole_numbers=model_field.name in whole_number_lists,
                             label=kwargs.get("label") or capfirst(model_field.verbose_name), help_text=model_field.help_text)
        field = model_field.formfield(**kwargs)
        if model_field.name in optional:
            field.required = False
        return field

    return type(f"{model.__name__}Form", (forms.Form,), {
        **forms.fields_for_model(model, fields=fields, labels=labels, formfield_callback=formfield), "keep_when_absent": tuple(optional)})


@dataclass(frozen=True)
class PolicyKind:
    kind: str
    noun: str  # in messages: "SLO policy of <application> saved."
    form_class: type[forms.Form]
    update: object  # the service

    @property
    def model(self):
        return policy_model(self.kind)

    @property
    def view_perm(self) -> str:
        return f"policies.view_{self.model._meta.model_name}"

    @property
    def change_perm(self) -> str:
        return f"policies.change_{self.model._meta.model_name}"


KINDS = {
    "slo": PolicyKind("slo", "SLO policy", _form_class(
        policy_model("slo"), ["latency_p99_ms", "min_accuracy", "priority", "drop_rule", "expected_rps", "scale_to_zero"],
        {"latency_p99_ms": "p99 latency SLO (ms)", "min_accuracy": "Minimum accuracy (0..1)", "priority": "Priority (0..100)",
         "drop_rule": "Drop rule", "expected_rps": "Expected demand (req/s)", "scale_to_zero": "No capacity while idle"},
    ), slo_policy_update),
    "replan": PolicyKind("replan", "Re-planning policy", _form_class(
        policy_model("replan"),
        ["enabled", "interval_seconds", "demand_change_threshold", "auto_apply", "debounce_seconds", "demand_window_seconds",
         "forecast_horizon_seconds", "demand_memory_seconds", "host_lost_after_seconds", "headroom_target"],
        {"enabled": "Enabled", "interval_seconds": "Re-plan every (s)", "demand_change_threshold": "Demand change threshold",
         "auto_apply": "Apply new plans automatically", "debounce_seconds": "Debounce (s)", "demand_window_seconds": "Demand window (s)",
         "forecast_horizon_seconds": "Forecast horizon (s)", "demand_memory_seconds": "Demand memory (s)",
         "host_lost_after_seconds": "Host lost after (s)", "headroom_target": "Headroom before accuracy (x demand)"},
        optional=("headroom_target",),
    ), replan_policy_update),
    "profiling": PolicyKind("profiling", "Profiling policy", _form_class(
        policy_model("profiling"),
        ["enabled", "auto_profile_new_variants", "device_types", "slices", "batch_sizes", "cpu_threads", "timeout_s"],
        {"enabled": "Enabled", "auto_profile_new_variants": "Profile new variants automatically", "device_types": "Device types",
         "slices": "GPU slices", "batch_sizes": "Batch sizes", "cpu_threads": "CPU threads", "timeout_s": "Timeout (s)"},
        whole_number_lists=("batch_sizes", "cpu_threads"),
    ), profiling_policy_update),
}


@dataclass
class PolicyCard:
    """One policy on the page: an edit form for operators, its values read-only for viewers."""

    kind: str
    pk: int
    title: str
    colour: str | None = None
    badges: list[str] = field(default_factory=list)
    form: forms.Form | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return f"{self.kind}-{self.pk}"


def _display(policy, name: str, form_field: forms.Field) -> str:
    value = getattr(policy, name)
    if isinstance(form_field, forms.ChoiceField):
        return getattr(policy, f"get_{name}_display")()
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "all (default)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _form(kind: str, policy, data=None) -> forms.Form:
    initial = {name: getattr(policy, name) for name in KINDS[kind].form_class.base_fields}
    return KINDS[kind].form_class(data, initial=initial, auto_id=f"id_{kind}{policy.pk}_%s")


def _slo_ms(application) -> float | None:
    slo = getattr(application, "slo_policy", None)
    return slo.latency_p99_ms if slo is not None else None


def _card(kind: str, policy, can_change: bool, bound: forms.Form | None) -> PolicyCard:
    form_class = KINDS[kind].form_class
    if kind == "slo":
        card = PolicyCard(kind, policy.pk, policy.application.name, colour=application_colour(policy.application.name))
    else:
        card = PolicyCard(kind, policy.pk, policy.name, badges=[] if policy.enabled else ["disabled"])
    if can_change:
        card.form = bound if bound is not None else _form(kind, policy)
    else:
        card.facts = [(f.label, _display(policy, name, f)) for name, f in form_class.base_fields.items()]
    return card


def _errors_to_form(form: forms.Form, exc: ValidationError) -> None:
    """The service's refusal shown on the form: next to its field, or above the form."""
    if not hasattr(exc, "error_dict"):
        form.add_error(None, exc)
        return
    for name, errors in exc.error_dict.items():
        if name in form.fields:
            form.add_error(name, errors)
        else:
            form.add_error(None, [f"{name}: {m}" if name != "__all__" else m for e in errors for m in e.messages])


def _policy_save(request):
    """Update the policy named by the POST's kind and pk; (kind, pk, form) with its errors when refused,
    None when saved."""
    spec = KINDS.get(request.POST.get("kind", ""))
    if spec is None:
        raise Http404("No such kind of policy.")
    _require(request, spec.change_perm, "Changing policies needs the operator role.")
    pk = request.POST.get("pk", "")
    if not pk.isdigit():
        raise Http404("No such policy.")
    policy = get_object_or_404(policy_queryset_for(request.user, spec.kind, "change"), pk=int(pk))
    form = _form(spec.kind, policy, request.POST)
    if form.is_valid():
        try:
            with change_context(request=request, source="web"):
                spec.update(policy=policy, data={k: v for k, v in form.cleaned_data.items() if v is not None or k not in form.keep_when_absent})
        except ValidationError as exc:
            _errors_to_form(form, exc)
        else:
            name = f"of {policy.application.name}" if spec.kind == "slo" else policy.name
            messages.success(request, f"{spec.noun} {name} saved.")
            return None
    return spec.kind, policy.pk, form


# --------------------------------------------------------------------------- ensemble policies


class EnsemblePolicyForm(forms.Form):
    """An ensemble policy as typed: the members one per line (the CLI's VARIANT=PROBABILITY[:WEIGHT]). Only
    parsed here: the service (`ensemble_policy_set`, the engine's rules) validates and saves."""

    mode = forms.ChoiceField(choices=[(v, v) for v in EnsembleModeChoices.values], label="Mode",
                             help_text="; ".join(f"{v}: {label[0].lower()}{label[1:]}" for v, label in EnsembleModeChoices.choices))
    members = forms.CharField(
        label="Members", widget=forms.Textarea(attrs={"rows": 4, "cols": 28}),
        help_text="VARIANT=PROBABILITY[:WEIGHT], one per line: the sampling probabilities sum to 1, the vote weights are > 0 (default 1)",
    )
    min_size = forms.IntegerField(label="Fewest members per query", required=False, help_text="Empty: 1")
    max_size = forms.IntegerField(label="Most members per query", required=False,
                                  help_text="Empty: every member with a probability > 0 (single: 1)")
    vote = forms.ChoiceField(choices=[(v, v) for v in EnsembleVoteChoices.values], label="Vote",
                             help_text="; ".join(f"{v}: {label[0].lower()}{label[1:]}" for v, label in EnsembleVoteChoices.choices))
    scheduler = forms.CharField(label="Learned scheduler", required=False, max_length=200,
                                help_text="Mode learned: the scheduler's ONNX policy, e.g. demo-ensemble")

    def clean_members(self):
        try:
            return ensemble_members_parse(self.cleaned_data["members"])
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["members"]) from None

    def policy_data(self) -> dict:
        return {k: v for k, v in self.cleaned_data.items() if k != "application" and v is not None}


class EnsemblePolicyNewForm(EnsemblePolicyForm):
    application = forms.ModelChoiceField(queryset=None, label="Application", empty_label=None)
    field_order = ["application"]

    def __init__(self, *args, applications, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["application"].queryset = applications


def _ensemble_form(policy: EnsemblePolicy, data=None) -> EnsemblePolicyForm:
    initial = {"mode": policy.mode, "members": ensemble_members_text(policy), "min_size": policy.min_size, "max_size": policy.max_size,
               "vote": policy.vote, "scheduler": policy.scheduler}
    return EnsemblePolicyForm(data, initial=initial, auto_id=f"id_ensemble{policy.pk}_%s")


def _ensemble_new_form(user, data=None) -> EnsemblePolicyNewForm:
    applications = application_queryset_for(user).filter(variants__isnull=False, ensemble_policy__isnull=True).distinct()
    return EnsemblePolicyNewForm(data, applications=applications, initial={"mode": EnsembleModeChoices.RANDOM},
                                 auto_id="id_ensemble_new_%s")


def _ensemble_save(request):
    """Create, change (POST pk) or clear (POST clear) an application's ensemble policy through the service;
    ("ensemble", pk or "new", form) with its errors when refused, None when done."""
    pk = request.POST.get("pk", "")
    if pk == "new":
        _require(request, "policies.add_ensemblepolicy", "Adding ensemble policies needs the operator role.")
        form, policy = _ensemble_new_form(request.user, request.POST), None
    elif pk.isdigit():
        action = "delete" if "clear" in request.POST else "change"
        _require(request, f"policies.{action}_ensemblepolicy", "Changing ensemble policies needs the operator role.")
        policy = get_object_or_404(EnsemblePolicy.objects.restrict(request.user, action).select_related("application"), pk=int(pk))
        if action == "delete":
            with change_context(request=request, source="web"):
                ensemble_policy_delete(policy=policy, actor=request.user)
            messages.success(request, f"Ensemble policy of {policy.application.name} cleared: one variant per query.")
            return None
        form = _ensemble_form(policy, request.POST)
    else:
        raise Http404("No such policy.")
    if form.is_valid():
        application = form.cleaned_data["application"] if policy is None else policy.application
        try:
            with change_context(request=request, source="web"):
                ensemble_policy_set(application=application, data=form.policy_data(), actor=request.user)
        except ValidationError as exc:
            _errors_to_form(form, exc)
        else:
            messages.success(request, f"Ensemble policy of {application.name} saved.")
            return None
    return "ensemble", pk, form


def _ensemble_section(request, refused) -> dict:
    """The ensemble policies' cards (an edit form each for operators, the values for viewers; what the routers
    counted of each) and, for operators, the form that gives an application without one its policy."""
    user = request.user
    overview = ensembles_overview(user)
    can_change = user.has_perm("policies.change_ensemblepolicy")
    bound = {refused[1]: refused[2]} if refused and refused[0] == "ensemble" else {}
    cards = []
    for policy in overview.policies:
        cards.append({
            "policy": policy, "anchor": f"ensemble-{policy.pk}", "colour": application_colour(policy.application.name),
            "form": (bound.get(str(policy.pk)) or _ensemble_form(policy)) if can_change else None,
            "members": policy.member_list(), "frequencies": overview.frequencies.get(policy.pk),
            "latency": overview.latency.get(policy.pk), "slo_ms": _slo_ms(policy.application),
        })
    new_form = None
    if user.has_perm("policies.add_ensemblepolicy") and overview.applications_without:
        new_form = bound.get("new") or _ensemble_new_form(user)
    return {"visible": user.has_perm("policies.view_ensemblepolicy"), "cards": cards, "new_form": new_form, "window_s": overview.window_s,
            "can_clear": user.has_perm("policies.delete_ensemblepolicy"),
            "without": [a.name for a in overview.applications_without]}


@login_required
def policies(request):
    """Each application's SLO policy, the re-planning and the profiling policies (viewer and up:
    `policies.view_*`); operators and up (`policies.change_*`) get an edit form per policy. A refused edit
    comes back with status 400, the errors next to their fields and the typed values kept; nothing is saved."""
    if not any(request.user.has_perm(perm) for perm in VIEW_PERMS):
        raise PermissionDenied("Viewing policies needs the viewer role.")
    status, refused = 200, None
    if request.method == "POST":
        refused = _ensemble_save(request) if request.POST.get("kind") == "ensemble" else _policy_save(request)
        if refused is None:
            return redirect("dashboard:policies")
        status = 400
    overview = policies_overview(request.user)
    sections = {}
    for kind in POLICY_KINDS:
        can_change = request.user.has_perm(KINDS[kind].change_perm)
        cards = []
        for policy in getattr(overview, kind):
            bound = refused[2] if refused and refused[:2] == (kind, policy.pk) else None
            card = _card(kind, policy, can_change, bound)
            if kind == "replan" and policy.pk == overview.replan_governing_pk:
                card.badges.insert(0, "governs triggers")
            cards.append(card)
        sections[kind] = {"cards": cards, "visible": request.user.has_perm(KINDS[kind].view_perm), "can_change": can_change}
    sections["ensemble"] = _ensemble_section(request, refused)
    context = {"sections": sections, "applications_without_slo": overview.applications_without_slo, "nav": "policies"}
    return render(request, "dashboard/policies.html", context, status=status)
