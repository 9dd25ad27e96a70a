"""The compose stack's first-run set-up (compose.yaml's `bootstrap` service, after the migrations; safe to
run again, as every `docker compose up` does):

- the admin login TESSERA_ADMIN_USER (default `admin`) with the password TESSERA_ADMIN_PASSWORD (required:
  no default, as production has none for a secret), a superuser, which Tessera takes for its admin role;
  the password is set again from the environment on each run;
- the simulated agent's Host (`--agent-host`, backend simulated) with an agent token, and a credential for
  the router (`--router`), written to files in `--credentials` (mode 0600), which the agent and router
  containers read as the Kubernetes pods read their Secrets. A token or credential whose file still
  verifies against the database is kept (running containers keep working); otherwise a new one is issued,
  as `tessera agent-token HOST` and `tessera router-credential issue NAME` issue them.

Run as `python deploy/docker/bootstrap.py --credentials DIR --agent-host NAME --router NAME` with the
control plane's environment (DJANGO_SETTINGS_MODULE and what those settings read)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _secret_write(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(secret + "\n")
    temporary.chmod(0o600)
    temporary.replace(path)


def _secret_read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def bootstrap(*, credentials: Path, agent_host: str, router: str) -> list[str]:
    """Do the set-up; returns what it did, one line each."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from apps.core.context import change_context
    from apps.inventory.choices import HostBackendChoices
    from apps.inventory.models import Host
    from apps.inventory.services import (
        host_agent_token_rotate, host_by_agent_token, router_credential_by_secret, router_credential_issue,
    )

    password = os.environ.get("TESSERA_ADMIN_PASSWORD", "")
    if not password:
        raise SystemExit("bootstrap: set TESSERA_ADMIN_PASSWORD (the admin's password; no default)")
    username = os.environ.get("TESSERA_ADMIN_USER", "admin")
    done = []
    with change_context(source="command"), transaction.atomic():
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        done.append(f"admin login {username!r} {'created' if created else 'password set'}")

        host, created = Host.objects.get_or_create(
            name=agent_host, defaults={"backend": HostBackendChoices.SIMULATED, "description": "The compose stack's simulated agent"})
        token_file = credentials / "agent-token"
        if host_by_agent_token(secret=_secret_read(token_file)) == host:
            done.append(f"agent token of host {agent_host!r} kept")
        else:
            _secret_write(token_file, host_agent_token_rotate(host=host))
            done.append(f"agent token of host {agent_host!r} issued ({'new host' if created else 'host existed'})")

        credential_file = credentials / "router-credential"
        credential = router_credential_by_secret(secret=_secret_read(credential_file))
        if credential is not None and credential.name == router:
            done.append(f"credential of router {router!r} kept")
        else:
            _credential, secret = router_credential_issue(name=router, description="The compose stack's router")
            _secret_write(credential_file, secret)
            done.append(f"credential of router {router!r} issued")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--credentials", type=Path, required=True, help="Folder the agent token and router credential are written to")
    parser.add_argument("--agent-host", required=True, help="The simulated agent's host name")
    parser.add_argument("--router", required=True, help="The router's name")
    args = parser.parse_args(argv)
    for line in bootstrap(credentials=args.credentials, agent_host=args.agent_host, router=args.router):
        print(f"bootstrap: {line}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout (the image's working directory)
    sys.exit(main())
