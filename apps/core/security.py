"""Finding secrets in logs. Pure Python, no Django: the tests grep the control plane's log records with it
(tests/security/test_secrets_not_logged.py) and the soak bench its processes' log files (benches/soak.py).

A secret counts as logged when any WINDOW consecutive characters of it appear (all of it when shorter): a
log line that cut the secret short, or kept only its end, leaks it as much as one that printed it whole. The
display prefix Tessera shows of a token (`tsu_` and six characters, 10 in all) is shorter than the window,
so showing it is not a finding. An Authorization header carries its secret whole, so it is found too."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

WINDOW = 16  # characters of a 256-bit token (43 of base64url) that identify it: 96 bits
ANCHOR = 8  # searched for in the text, then extended: every WINDOW-long piece holds one of the anchors


@dataclass(frozen=True)
class SecretInLog:
    """Where a secret was found: which (its name, never its value), the 1-based line, and the line with every
    character of the secret that was found replaced by `*`."""

    name: str
    line: int
    excerpt: str

    def __str__(self) -> str:
        return f"{self.name} on line {self.line}: {self.excerpt}"


def _named(secrets: Mapping[str, str] | Iterable[str]) -> list[tuple[str, str]]:
    if isinstance(secrets, Mapping):
        pairs = list(secrets.items())
    else:
        pairs = [(f"secret #{i + 1} ({secret[:4]}…)" if len(secret) > 12 else f"secret #{i + 1}", secret) for i, secret in enumerate(secrets)]
    return [(name, secret) for name, secret in pairs if secret]


def _matches(text: str, secret: str) -> list[tuple[int, int]]:
    """(start, end) in `text` of every run of at least WINDOW characters that is also a run of `secret`."""
    window = min(WINDOW, len(secret))
    anchor = min(ANCHOR, window)
    stride = window - anchor + 1  # a window-long piece of the secret starting anywhere holds the anchor at some multiple
    found: set[tuple[int, int]] = set()
    for offset in range(0, len(secret) - anchor + 1, stride):
        piece = secret[offset:offset + anchor]
        at = text.find(piece)
        while at >= 0:
            left = 0
            while at - left > 0 and offset - left > 0 and text[at - left - 1] == secret[offset - left - 1]:
                left += 1
            right = 0
            end = at + anchor
            while end + right < len(text) and offset + anchor + right < len(secret) and text[end + right] == secret[offset + anchor + right]:
                right += 1
            if left + anchor + right >= window:
                found.add((at - left, end + right))
            at = text.find(piece, at + 1)
    return sorted(found)


def secrets_in_logs_find(text: str, secrets: Mapping[str, str] | Iterable[str]) -> list[SecretInLog]:
    """Every line of `text` (a log, or any text) that holds a secret, in order, once per secret it holds; []
    when none does. `secrets` is {name: secret} or a list of secrets (then named by their position and prefix).
    The findings never hold a secret (every secret found on a line is masked in its excerpt): print them as
    they are. A few substring searches of the whole text per secret (about 0.2 s per 100 MB each here)."""
    spans = {name: _matches(text, secret) for name, secret in _named(secrets)}
    every = sorted(span for found in spans.values() for span in found)
    findings = []
    for name, found in spans.items():
        for begin in sorted({text.rfind("\n", 0, start) + 1 for start, _end in found}):
            stop = text.find("\n", begin)
            stop = len(text) if stop < 0 else stop
            shown = list(text[begin:stop])
            for start, end in every:
                if start < stop and end > begin:
                    lo, hi = max(start, begin) - begin, min(end, stop) - begin
                    shown[lo:hi] = "*" * (hi - lo)
            findings.append(SecretInLog(name=name, line=text.count("\n", 0, begin) + 1, excerpt="".join(shown)[:300]))
    return sorted(findings, key=lambda f: (f.line, f.name))
