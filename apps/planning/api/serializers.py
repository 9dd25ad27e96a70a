from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import ChoiceTextField
from engine.plans.problem import OBJECTIVES
from engine.solvers.registry import PLANNER_KINDS

from ..choices import PlanStatusChoices, PlanTriggerChoices, PredictionTargetChoices
from ..models import Plan, PredictionCheck
from ..services import HEADROOM_MAX, PLAN_RUN_DEFAULTS, PLAN_RUN_SOLVERS, TIME_LIMIT_MAX_S


class PlanRunOptionsSerializer(serializers.Serializer):
    """Options of a plan run; every one is optional (defaults in brackets)."""

    solver = serializers.ChoiceField(
        choices=list(PLAN_RUN_SOLVERS), required=False,
        help_text=f"The planner [{PLAN_RUN_DEFAULTS['solver']}]: GET /api/v1/planners/ lists them with their kind and paper; a mixed "
        "fleet, pipelines and vertically scaled CPU applications are planned by the planners of their kinds beside it (docs/planning.md)",
    )
    objective = serializers.ChoiceField(choices=list(OBJECTIVES), required=False, help_text=f"[{PLAN_RUN_DEFAULTS['objective']}]")
    time_limit_s = serializers.FloatField(
        required=False, min_value=0.001, max_value=TIME_LIMIT_MAX_S, help_text=f"The solver's time limit [{PLAN_RUN_DEFAULTS['time_limit_s']:g}]",
    )
    headroom = serializers.FloatField(
        required=False, min_value=1.0, max_value=HEADROOM_MAX,
        help_text=f"Plan for the observed demand times this [{PLAN_RUN_DEFAULTS['headroom']:g}]",
    )
    headroom_target = serializers.FloatField(
        required=False, min_value=1.0, max_value=HEADROOM_MAX,
        help_text="The fleet planner: when the most accurate plan could serve less than this multiple of the planned demand, plan for "
                  "the most accuracy at the largest multiple up to this the fleet can serve [the re-planning policy's headroom_target, 1 "
                  "without one]",
    )
    mip_gap = serializers.FloatField(required=False, min_value=0.0, max_value=1.0, help_text="Relative MIP gap [the engine's, 0]")
    reconfiguration_penalty = serializers.FloatField(
        required=False, min_value=0.0, max_value=1.0,
        help_text=f"Cost per MIG instance destroyed or created, in effective-accuracy units [{PLAN_RUN_DEFAULTS['reconfiguration_penalty']:g}]",
    )
    include_registered = serializers.BooleanField(
        required=False, help_text="Also plan hosts whose agent has never reported, as declared [false]",
    )
    demand = serializers.DictField(
        child=serializers.FloatField(min_value=0.0), required=False,
        help_text="{application: rps}: plan the applications named for this demand instead of their estimate (a what-if); "
                  "the others keep theirs",
    )
    trigger_detail = serializers.CharField(required=False, allow_blank=True, max_length=500, help_text="Why this run (shown on the plan)")


class PlanListSerializer(serializers.ModelSerializer):
    """A plan without its large documents (problem, result, desired states, routing, diff details)."""

    display = serializers.CharField(source="__str__", read_only=True)
    status = ChoiceTextField(choices=PlanStatusChoices.choices, read_only=True)
    trigger = ChoiceTextField(choices=PlanTriggerChoices.choices, read_only=True)
    valid = serializers.SerializerMethodField()
    diff_summary = serializers.SerializerMethodField()
    # null: a plan the control loop ran (no user), one not approved yet.
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who ran the plan (null: the control loop)"
    )
    approved_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True, help_text="Who approved it (null: not approved, or applied automatically)"
    )

    class Meta:
        model = Plan
        fields = [
            "id", "display", "status", "trigger", "trigger_detail", "job", "previous", "solver", "objective_kind", "solver_status",
            "objective", "bound", "gap", "solve_seconds", "effective_accuracy", "shortfall", "valid", "diff_summary", "notes",
            "created_by", "approved_by", "approved_at", "activated_at", "created", "last_updated",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.BooleanField(allow_null=True))
    def get_valid(self, obj) -> bool | None:
        return obj.validation.get("valid") if obj.validation else None

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_diff_summary(self, obj) -> dict:
        return (obj.diff or {}).get("summary", {})


class PredictionCheckSerializer(serializers.ModelSerializer):
    """An applied plan's prediction against what was measured while it was active, for one target
    (apps.planning.prediction): the violation error is in points of ratio (measured - predicted), the p99
    error relative ((measured - predicted) / predicted)."""

    kind = ChoiceTextField(choices=PredictionTargetChoices.choices, read_only=True)

    class Meta:
        model = PredictionCheck
        fields = ["id", "plan", "target", "kind", "window_start", "window_end", "predicted_rps", "measured_rps",
                  "predicted_violation_ratio", "measured_violation_ratio", "violation_error",
                  "predicted_p99_ms", "measured_p99_ms", "p99_error", "note"]
        read_only_fields = fields


class PlanSerializer(PlanListSerializer):
    """Everything about a plan: its inputs (`problem`, `demand`, `devices`), the engine's answer (`result`),
    the validator's verdict, the simulator's prediction and, once it has been active a while, that
    prediction against what was measured (`prediction_checks`), what applying it writes (`desired_states`,
    `routing`), the diff against what runs now and its rollout record."""

    prediction_checks = PredictionCheckSerializer(many=True, read_only=True)

    class Meta(PlanListSerializer.Meta):
        fields = PlanListSerializer.Meta.fields + [
            "demand", "validation", "prediction", "prediction_checked_at", "prediction_checks", "diff", "desired_states", "routing", "rollout",
            "devices", "problem", "result",
        ]
        read_only_fields = fields


class ConflictErrorBodySerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    job = serializers.IntegerField(help_text="The job that is already running")


class ConflictErrorSerializer(serializers.Serializer):
    error = ConflictErrorBodySerializer()


class PlannerSerializer(serializers.Serializer):
    """A planner of the registry (engine/solvers/registry.py)."""

    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=list(PLANNER_KINDS))
    summary = serializers.CharField()
    paper = serializers.CharField(help_text="The paper and section it follows")
    pipelines_by = serializers.CharField(help_text="The planner of the problem's pipelines when this one is chosen")
    reads_ensembles = serializers.BooleanField(help_text="Plans ensemble applications itself (garrison by its Algorithm 1, fleet counting each "
                                              "ensemble whole); the others get one application per member")
    plans_mps = serializers.BooleanField(help_text="Plans MPS GPUs beside the other devices in one model")
    plans_pipelines = serializers.BooleanField(help_text="Plans the problem's pipelines inside its own model (the others: pipelines first, "
                                               "then the rest on what is left)")
    simulated = serializers.BooleanField(help_text="tessera simulate replays its plans")
    plan_runs = serializers.BooleanField(help_text="A plan run may use it (the evaluation baselines are for simulation)")
