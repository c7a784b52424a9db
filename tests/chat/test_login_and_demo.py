"""Issue 11, Medium: the demo user is a plain user with a one-time password; logins are throttled."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client as HttpClient

pytestmark = pytest.mark.django_db


def test_demo_user_is_plain_with_a_random_password_printed_once() -> None:
    out = io.StringIO()
    call_command("ensure_demo_user", stdout=out)
    user = get_user_model().objects.get(username="demo")
    assert not user.is_superuser and not user.is_staff
    match = re.search(r"password '([^']+)'", out.getvalue())
    assert match and match.group(1) != "demo-password"
    assert user.check_password(match.group(1)) and not user.check_password("demo-password")
    again = io.StringIO()
    call_command("ensure_demo_user", stdout=again)
    assert match.group(1) not in again.getvalue()


def test_login_attempts_are_throttled(settings) -> None:
    get_user_model().objects.create_user("victim", password="right-password-1")
    http = HttpClient()
    codes = [
        http.post("/login/", {"username": "victim", "password": "wrong"}).status_code
        for _ in range(settings.AXES_FAILURE_LIMIT)
    ]
    assert codes == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]  # the form again, then the lockout
    locked = http.post("/login/", {"username": "victim", "password": "right-password-1"})
    assert locked.status_code == 429
    assert "_auth_user_id" not in http.session
    # another username from the same address is not locked out
    get_user_model().objects.create_user("other", password="right-password-2")
    assert http.post("/login/", {"username": "other", "password": "right-password-2"}).status_code == 302
