"""Bearer secrets: random, shown once, stored as SHA-256. A fast hash is right here (unlike passwords):
the secret has 256 bits of entropy, and lookups by hash happen on every API request."""
from __future__ import annotations

import hashlib
import secrets

# Prefixes, not secrets: what tells the kinds apart (the secret is the random rest, token_generate).
USER_TOKEN_PREFIX = "tsu_"  # nosec B105 - a prefix
AGENT_TOKEN_PREFIX = "tsa_"  # nosec B105 - a prefix
ROUTER_TOKEN_PREFIX = "tsr_"  # nosec B105 - a prefix


def token_generate(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_display(secret: str) -> str:
    """What may be shown after creation: the prefix and the first characters, enough to tell tokens apart."""
    return secret[:10]


def token_from_header(header: str | None) -> str | None:
    """`Authorization: Token <secret>` or `Authorization: Bearer <secret>`."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() not in ("token", "bearer") or not value.strip():
        return None
    return value.strip()
