"""Sign-in throttling (issue 44: "ten wrong passwords in a row at the dashboard's login are each answered as
the first was"): after LOGIN_FREE_FAILURES failures of a username, or from an address, each attempt must wait
an exponentially growing delay, refused with 429 and Retry-After without the password being checked; the
admin's sign-in goes through the same backend; a success clears the username's failures."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.users.models import LoginFailure
from apps.users.services import LOGIN_DELAY_MAX_S, LOGIN_FREE_FAILURES, login_throttle_wait

pytestmark = pytest.mark.django_db

PASSWORD = "Right-password-1"


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password=PASSWORD)


def _sign_in(client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def _age(seconds: float) -> None:
    """The recorded failures, `seconds` older (the test's clock)."""
    for failure in LoginFailure.objects.all():
        failure.created -= timedelta(seconds=seconds)
        failure.save(update_fields=["created"])


def test_ten_wrong_passwords_are_slowed_down_and_the_right_one_waits_too(client, alice) -> None:
    answers = [_sign_in(client, "alice", f"wrong-{i}") for i in range(10)]
    free, slowed = answers[:LOGIN_FREE_FAILURES], answers[LOGIN_FREE_FAILURES:]
    assert [a.status_code for a in free] == [200] * LOGIN_FREE_FAILURES
    assert all(b"did not match" in a.content for a in free)
    assert [a.status_code for a in slowed] == [429] * len(slowed)
    assert all(int(a["Retry-After"]) >= 1 and b"Too many failed sign-ins" in a.content for a in slowed)
    # Refused unchecked, so not counted: the wait does not grow while a client hammers.
    assert LoginFailure.objects.filter(username="alice").count() == LOGIN_FREE_FAILURES
    # The right password during the wait is refused too (the guesser cannot tell it was right).
    assert _sign_in(client, "alice", PASSWORD).status_code == 429
    assert "_auth_user_id" not in client.session
    _age(2)
    assert _sign_in(client, "alice", PASSWORD).status_code == 302 and "_auth_user_id" in client.session
    assert not LoginFailure.objects.filter(username="alice").exists()  # a success forgives the username


def test_the_wait_doubles_with_each_checked_failure_up_to_the_cap(alice) -> None:
    now = timezone.now()
    for k in range(LOGIN_FREE_FAILURES + 3):
        LoginFailure.objects.create(username="alice", address="10.0.0.9", created=now)
    assert 7.0 < login_throttle_wait(username="alice", address=None) <= 8.0  # 2^(8 - 5) s after the last
    for _ in range(20):
        LoginFailure.objects.create(username="alice", address="10.0.0.9", created=now)
    assert LOGIN_DELAY_MAX_S - 1 < login_throttle_wait(username="alice", address=None) <= LOGIN_DELAY_MAX_S
    _age(16 * 60)  # failures older than the window no longer count
    assert login_throttle_wait(username="alice", address=None) == 0.0


def test_one_address_guessing_many_usernames_is_slowed_down(client, alice) -> None:
    for i in range(LOGIN_FREE_FAILURES):
        assert _sign_in(client, f"user-{i}", "guess", address="10.0.0.7").status_code == 200
    assert _sign_in(client, "alice", PASSWORD, address="10.0.0.7").status_code == 429
    # From elsewhere, alice signs in: her username has not failed.
    assert _sign_in(client, "alice", PASSWORD, address="10.0.0.8").status_code == 302


def test_the_admin_sign_in_is_throttled_by_the_same_backend(client, alice) -> None:
    alice.is_staff = alice.is_superuser = True
    alice.save()
    for i in range(LOGIN_FREE_FAILURES):
        client.post("/admin/login/", {"username": "alice", "password": f"wrong-{i}"}, REMOTE_ADDR="10.0.0.3")
    answer = client.post("/admin/login/?next=/admin/", {"username": "alice", "password": PASSWORD}, REMOTE_ADDR="10.0.0.3")
    assert answer.status_code == 200 and "_auth_user_id" not in client.session
