from django.db import models


class DropRuleChoices(models.TextChoices):
    NEVER = "never", "Never drop"
    DEADLINE = "deadline", "Drop a query that can no longer meet its deadline"
    SLO_1X = "slo-1x", "Drop a query waiting longer than the SLO"
    SLO_2X = "slo-2x", "Drop a query waiting longer than twice the SLO"
