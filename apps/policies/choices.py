from django.db import models


class DropRuleChoices(models.TextChoices):
    NEVER = "never", "Never drop"
    DEADLINE = "deadline", "Drop a query that can no longer meet its deadline"
    SLO_1X = "slo-1x", "Drop a query waiting longer than the SLO"
    SLO_2X = "slo-2x", "Drop a query waiting longer than twice the SLO"


class EnsembleModeChoices(models.TextChoices):
    """An application's ensemble mode (engine/ensembles/policy.py, ENSEMBLE_MODES)."""

    SINGLE = "single", "One variant per query (the plan's routing weights)"
    RANDOM = "random", "A random ensemble per query, drawn by sampling probability"
    LEARNED = "learned", "The learned scheduler picks the members of each query"


class EnsembleVoteChoices(models.TextChoices):
    """How the members' answers are combined (engine/ensembles/policy.py, ENSEMBLE_VOTES)."""

    SOFT = "soft", "Weighted mean of the members' outputs"
    HARD = "hard", "Weighted count of each member's top class"
