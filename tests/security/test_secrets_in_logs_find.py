"""apps.core.security.secrets_in_logs_find, the grep the log tests and the soak bench share: a secret is
found whole, cut short or cut at the front, in an Authorization header, next to another; the display prefix
Tessera shows is not a finding; a finding never holds a secret."""
from __future__ import annotations

import secrets

from apps.core.security import WINDOW, secrets_in_logs_find
from apps.users.tokens import AGENT_TOKEN_PREFIX, ROUTER_TOKEN_PREFIX, token_display, token_generate


def test_a_secret_is_found_whole_cut_or_in_a_header_and_never_shown():
    agent, router = token_generate(AGENT_TOKEN_PREFIX), token_generate(ROUTER_TOKEN_PREFIX)
    log = "\n".join([
        "INFO starting",                                            # 1
        f"DEBUG send headers Authorization: Token {agent}",         # 2: whole, in a header
        f"INFO agent {token_display(agent)}… reported",             # 3: the display prefix: not a finding
        f"WARNING cut short {agent[:WINDOW]}",                      # 4
        f"WARNING its end {agent[-WINDOW:]}!",                      # 5
        f"ERROR both {router} and {agent}",                         # 6
        f"INFO nearly {agent[:WINDOW - 1]} {agent[-(WINDOW - 1):]}",  # 7: no WINDOW characters in a row
    ])
    found = secrets_in_logs_find(log, {"agent token": agent, "router credential": router})
    assert [(f.line, f.name) for f in found] == [
        (2, "agent token"), (4, "agent token"), (5, "agent token"), (6, "agent token"), (6, "router credential")]
    shown = "\n".join(map(str, found))
    assert not secrets_in_logs_find(shown, [agent, router])  # every secret on a found line is masked
    assert found[0].excerpt == "DEBUG send headers Authorization: Token " + "*" * len(agent)
    assert found[2].excerpt == "WARNING its end " + "*" * WINDOW + "!"


def test_any_secret_any_length_and_nothing_found_in_clean_text():
    password = "Sh0rt-pass"  # shorter than the window: found whole only
    key = secrets.token_urlsafe(50) + "!@#"
    assert [f.line for f in secrets_in_logs_find(f"a\nlogin {password}\nb", [password])] == [2]
    assert not secrets_in_logs_find(f"login {password[:-1]}", [password])
    assert secrets_in_logs_find(f"SECRET_KEY={key[10:40]}", [key])[0].name.startswith("secret #1")
    assert secrets_in_logs_find("nothing here\n" * 1000, [key, password, ""]) == []
