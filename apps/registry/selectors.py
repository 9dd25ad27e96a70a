"""Registry selectors: reads other apps plan and translate with."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.dataplane.batching import application_batching

from .models import Application


def application_batching_overrides(*, names: Iterable[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The applications among `names` whose own configuration picks their batching (a Triton-style delay:
    engine.dataplane.batching.application_batching), as {name: (policy, params)}: what plans translate for
    their runtimes and what the plan's prediction simulates."""
    rows = Application.objects.filter(name__in=list(names), batching_delay_ms__isnull=False).values_list("name", "batching_delay_ms")
    return {name: chosen for name, delay in rows if (chosen := application_batching(delay)) is not None}
