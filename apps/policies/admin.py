from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from .models import EnsembleMember, EnsemblePolicy, ProfilingPolicy, ReplanPolicy, SloPolicy


@admin.register(SloPolicy)
class SloPolicyAdmin(admin.ModelAdmin):
    list_display = ["application", "latency_p99_ms", "min_accuracy", "priority", "drop_rule", "expected_rps", "scale_to_zero"]
    list_filter = ["drop_rule", "scale_to_zero"]


@admin.register(ReplanPolicy)
class ReplanPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "interval_seconds", "demand_change_threshold", "auto_apply"]


@admin.register(ProfilingPolicy)
class ProfilingPolicyAdmin(admin.ModelAdmin):
    list_display = ["name", "enabled", "auto_profile_new_variants", "device_types", "timeout_s"]


class EnsembleMemberFormSet(forms.BaseInlineFormSet):
    """The members with the policy's fields, checked by the service's reader (the engine's rules, the same
    messages as the API's) before anything is saved; `ensemble_data` is what the admin then saves."""

    ensemble_data = None

    def clean(self):
        super().clean()
        policy = self.instance
        if any(self.errors) or not policy.application_id:
            return
        from .services import ensemble_policy_read

        members = [
            {"variant": f.cleaned_data["variant"], "probability": f.cleaned_data["probability"], "weight": f.cleaned_data["weight"]}
            for f in self.forms if f.cleaned_data and f.cleaned_data.get("variant") and not f.cleaned_data.get("DELETE")
        ]
        data = {"mode": policy.mode, "min_size": policy.min_size, "max_size": policy.max_size, "vote": policy.vote,
                "scheduler": policy.scheduler, "members": members}
        try:
            ensemble_policy_read(application=policy.application, data=data)
        except ValidationError as exc:
            raise forms.ValidationError(exc.messages) from exc
        self.ensemble_data = data


class EnsembleMemberInline(admin.TabularInline):
    model = EnsembleMember
    formset = EnsembleMemberFormSet
    fields = ["variant", "probability", "weight"]
    autocomplete_fields = ["variant"]
    extra = 1


class EnsemblePolicyAdminForm(forms.ModelForm):
    class Meta:
        model = EnsemblePolicy
        fields = ["application", "mode", "min_size", "max_size", "vote", "scheduler"]

    def clean(self):
        self.instance.members_checked_apart = True  # checked with the members by EnsembleMemberFormSet
        return super().clean()


@admin.register(EnsemblePolicy)
class EnsemblePolicyAdmin(admin.ModelAdmin):
    """Saved through `ensemble_policy_set` with its members as a whole, as the API, the CLI and the dashboard
    save it (the engine's rules, audited with the members before and after)."""

    form = EnsemblePolicyAdminForm
    list_display = ["application", "mode", "member_list", "min_size", "max_size", "vote"]
    list_filter = ["mode", "vote"]
    search_fields = ["application__name"]
    inlines = [EnsembleMemberInline]

    @admin.display(description="members")
    def member_list(self, obj) -> str:
        return ", ".join(f"{m.variant.name} ({m.probability:g})" for m in obj.member_list())

    def get_readonly_fields(self, request, obj=None):
        return ["application"] if obj is not None else []  # a policy stays with its application

    def save_model(self, request, obj, form, change):
        pass  # written with its members in save_related, through the service

    def save_related(self, request, form, formsets, change):
        from .services import ensemble_policy_set

        data = next(fs.ensemble_data for fs in formsets if isinstance(fs, EnsembleMemberFormSet))
        saved = ensemble_policy_set(application=form.instance.application, data=data, actor=request.user)
        form.instance.pk = saved.pk
        for formset in formsets:  # what the admin's change message reads from a formset's save()
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
