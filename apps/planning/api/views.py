from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, parsers, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.viewsets import TesseraReadOnlyModelViewSet
from apps.core.principals import principal_is_agent
from apps.jobs.api.serializers import JobSerializer
from apps.jobs.services import JobConflict
from engine.solvers.registry import PLANNERS

from ..choices import PlanTriggerChoices
from ..filtersets import PlanFilterSet, PlanRunFilterSet, PredictionCheckFilterSet
from ..selectors import plan_queryset, plan_run_queryset, prediction_check_queryset
from ..services import PLAN_RUN_SOLVERS, plan_run_start
from .serializers import (ConflictErrorSerializer, PlanListSerializer, PlannerSerializer, PlanRunOptionsSerializer, PlanSerializer,
                          PredictionCheckSerializer)


def conflict_response(exc: JobConflict) -> Response:
    """409 in the project's error shape, naming the job that is in the way."""
    job = exc.job
    message = f"A {job.get_kind_display().lower()} job is already {job.status} (job {job.pk}); wait for it to finish."
    return Response({"error": {"status": 409, "code": "conflict", "message": message, "job": job.pk}}, status=status.HTTP_409_CONFLICT)


class CanChangePlans(permissions.BasePermission):
    """Operators and up (the `planning.add_plan` permission); never an agent."""

    message = "Only operators and admins start plan runs and move plans through their lifecycle."

    def has_permission(self, request, view):
        user = request.user
        return bool(user and user.is_authenticated and not principal_is_agent(user) and user.has_perm("planning.add_plan"))


class PlanRunViewSet(TesseraReadOnlyModelViewSet):
    """Plan runs: POST starts one (operators and up; one at a time in the fleet: 409 with the running
    job's id otherwise) and answers 202 with its job; GET lists the planning jobs and their progress. The
    plan a run makes is at /plans/?job={id}."""

    queryset = plan_run_queryset()
    serializer_class = JobSerializer
    filterset_class = PlanRunFilterSet
    ordering_fields = ["created", "status"]
    parser_classes = [parsers.JSONParser]

    def get_permissions(self):
        if self.action == "create":
            return [CanChangePlans()]
        return super().get_permissions()

    @extend_schema(
        description="Start a plan run (operators and up) with these options, all optional; 202 with its job. One at a time "
                    "in the fleet: 409 with the running job's id otherwise. The run's plan is at /plans/?job={id}. With the "
                    "database or the task broker away: 503 at once with Retry-After, and no job is created.",
        request=PlanRunOptionsSerializer,
        responses={
            202: JobSerializer, 409: OpenApiResponse(ConflictErrorSerializer, description="A plan run is already pending or running"),
            503: OpenApiResponse(description="The database or the task broker is unavailable; nothing was created (Retry-After)"),
        },
    )
    def create(self, request, *args, **kwargs):
        body = PlanRunOptionsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        options = dict(body.validated_data)
        trigger_detail = options.pop("trigger_detail", "")
        try:
            job = plan_run_start(trigger=PlanTriggerChoices.MANUAL, trigger_detail=trigger_detail, actor=request.user, options=options)
        except JobConflict as exc:
            return conflict_response(exc)
        job.refresh_from_db()  # in-process (eager) runs have finished by now
        return Response(JobSerializer(job, context=self.get_serializer_context()).data, status=status.HTTP_202_ACCEPTED)


class PlanViewSet(TesseraReadOnlyModelViewSet):
    """Plans: the list leaves out the large documents; a plan's record has everything (inputs, the
    engine's answer, validation, prediction, desired states, routing, diff, rollout). Operators approve a
    validated plan, apply an approved one (202 with the rollout job) and roll the active one back (202
    with the rollback job); a plan in the wrong state gets 400 saying why, a rollout already running 409."""

    queryset = plan_queryset()
    serializer_class = PlanSerializer
    filterset_class = PlanFilterSet
    ordering_fields = ["created", "status", "effective_accuracy"]

    def get_serializer_class(self):
        return PlanListSerializer if self.action == "list" else PlanSerializer

    def get_permissions(self):
        if self.action in ("approve", "apply", "rollback"):
            return [CanChangePlans()]
        return super().get_permissions()

    def restrict_action(self) -> str:
        # The lifecycle actions change a plan: the caller must be allowed to change plans to find it.
        return "change" if self.action in ("approve", "apply", "rollback") else super().restrict_action()

    @extend_schema(request=None, responses={200: PlanSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve a validated plan (it may then be applied)."""
        from ..rollout import plan_approve

        plan = plan_approve(plan=self.get_object(), actor=request.user)
        return Response(PlanSerializer(plan, context=self.get_serializer_context()).data)

    @extend_schema(
        request=None,
        responses={202: JobSerializer, 409: OpenApiResponse(ConflictErrorSerializer, description="A rollout or rollback is already running")},
    )
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Roll an approved plan out; 202 with the rollout job."""
        from ..rollout import plan_apply

        try:
            job = plan_apply(plan=self.get_object(), actor=request.user)
        except JobConflict as exc:
            return conflict_response(exc)
        job.refresh_from_db()
        return Response(JobSerializer(job, context=self.get_serializer_context()).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None,
        responses={202: JobSerializer, 409: OpenApiResponse(ConflictErrorSerializer, description="A rollout or rollback is already running")},
    )
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """Take the active plan back: the fleet returns to what it ran before it; 202 with the rollback job."""
        from ..rollout import plan_rollback

        try:
            job = plan_rollback(plan=self.get_object(), actor=request.user)
        except JobConflict as exc:
            return conflict_response(exc)
        job.refresh_from_db()
        return Response(JobSerializer(job, context=self.get_serializer_context()).data, status=status.HTTP_202_ACCEPTED)


class PredictionCheckViewSet(TesseraReadOnlyModelViewSet):
    """Applied plans' predictions against what was measured while each was active, one row per plan and
    target (apps.planning.prediction): how far the simulator's what-ifs can be trusted. Read-only; the
    control plane writes them once a plan's window is over."""

    queryset = prediction_check_queryset()
    serializer_class = PredictionCheckSerializer
    filterset_class = PredictionCheckFilterSet
    ordering_fields = ["window_end", "violation_error", "p99_error"]


class PlannerReadPermission(permissions.BasePermission):
    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated)


def _planner_data(info) -> dict:
    return {**info.as_dict(), "plan_runs": info.name in PLAN_RUN_SOLVERS}


class PlannerViewSet(viewsets.ViewSet):
    """The planners (engine/solvers/registry.py, read-only): what a plan run's `solver` and `tessera plan solve
    --solver` take, each with its kind and the paper it follows."""

    permission_classes = [PlannerReadPermission]
    lookup_value_regex = r"[^/]+"
    serializer_class = PlannerSerializer

    @extend_schema(responses=PlannerSerializer(many=True))
    def list(self, request):
        return Response(PlannerSerializer([_planner_data(p) for p in PLANNERS.values()], many=True).data)

    @extend_schema(responses={200: PlannerSerializer, 404: OpenApiResponse(description="Unknown planner")})
    def retrieve(self, request, pk=None):
        info = PLANNERS.get(pk)
        if info is None:
            raise exceptions.NotFound(f"No planner {pk!r}; GET /api/v1/planners/ lists them.")
        return Response(PlannerSerializer(_planner_data(info)).data)
