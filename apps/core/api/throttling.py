"""Rate limits of the API's own endpoints, on REST framework's throttling (a refusal is 429 with Retry-After,
in the API's one error shape: apps/core/api/exceptions.py).

Counted in Django's default cache: Redis under the production settings (controlplane/settings/base.py,
`redis_settings`), so every server process shares one count; the in-process memory cache on the embedded
defaults (the demo's one process) and in tests. A cache that cannot be reached does not refuse anything:
the request goes through, unthrottled, and the outage is logged (a rate limit must not take the API down
with Redis).

Refused secrets (wrong API tokens, agent tokens, router credentials) are slowed per client address by the
authentication itself, counted in the database: apps/users/authentication.py, BearerAuthentication."""
from __future__ import annotations

import logging
import re

from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

logger = logging.getLogger("tessera.security")

PERIODS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])[a-z]*\s*$")


def rate_parse(rate: str) -> tuple[int, int]:
    """(requests, period in seconds) of "N/period": a period is s, m, h or d (or a word starting so), with
    an optional count: "20/h", "5/15m", "100/day"."""
    match = RATE.match(rate or "")
    if match is None:
        raise ImproperlyConfigured(f"a throttle rate is 'N/period' (20/h, 5/15m), not {rate!r}")
    return int(match.group(1)), int(match.group(2) or 1) * PERIODS_S[match.group(3)]


class CacheRateThrottle(SimpleRateThrottle):
    """REST framework's rate throttle with the rate read from the settings when it is made (so a changed
    setting takes effect), periods such as "5/15m", and a cache that cannot be reached letting requests through."""

    def get_rate(self):
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        if self.scope not in rates:
            raise ImproperlyConfigured(f"REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] has no rate for {self.scope!r}")
        return rates[self.scope]

    def parse_rate(self, rate):
        return (None, None) if rate is None else rate_parse(rate)

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError) as exc:
            logger.warning("throttle %s not applied: its cache is away (%s)", self.scope, type(exc).__name__)
            return True


class TokenCreateThrottle(CacheRateThrottle):
    """Creating API tokens (POST /api/v1/tokens/): at most the `token_create` rate per user. Listing, reading
    and deleting tokens are not counted."""

    scope = "token_create"

    def get_cache_key(self, request, view):
        if request.method != "POST" or not (request.user and request.user.is_authenticated):
            return None  # nobody to count: the permission check has refused an anonymous request already
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}
