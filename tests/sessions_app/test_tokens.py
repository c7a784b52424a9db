"""API keys: only the hash is stored; revoked keys and inactive users authenticate nobody; the rules of a
new key (scopes, a user's limit, also when requests come at once)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from sessions_app.models import ApiToken
from sessions_app.tokens import (
    KeyRefused,
    authenticate_token,
    find_key,
    hash_token,
    issue_token,
    parse_scopes,
    revoke_token,
    still_authorized,
)

pytestmark = pytest.mark.django_db


def test_issue_and_authenticate(owner: Any) -> None:
    token, raw = issue_token(owner, name="ci")
    assert raw.startswith("agt_") and token.token_hash == hash_token(raw) and raw not in token.token_hash
    assert authenticate_token(raw) == owner
    assert ApiToken.objects.get().last_used_at is not None
    for bad in (None, "", "agt_wrong", "x" * 500):
        assert authenticate_token(bad) is None


def test_revocation_and_deactivation(owner: Any) -> None:
    token, raw = issue_token(owner)
    assert still_authorized(owner.pk, hash_token(raw))
    assert revoke_token(prefix=token.prefix) == 1
    assert authenticate_token(raw) is None and not still_authorized(owner.pk, hash_token(raw))
    assert revoke_token() == 0  # neither id nor prefix: revokes nothing
    _token, other = issue_token(owner)
    owner.is_active = False
    owner.save()
    assert authenticate_token(other) is None and not still_authorized(owner.pk, None)


def test_scopes_are_checked_kept_once_and_in_order(owner: Any) -> None:
    assert parse_scopes(["approvals", "read", " write ", "read"]) == ["read", "write", "approvals"]
    token, raw = issue_token(owner)
    assert token.scopes == ["read", "write", "approvals"]  # the default
    holder = find_key(raw)
    assert holder is not None and holder.scopes == {"read", "write", "approvals"} and not holder.is_staff
    for bad, reason in (([], "read"), (["write"], "read"), (["read", 3], "unknown"), (["read", "admin"], "staff")):
        with pytest.raises(KeyRefused, match=reason):
            issue_token(owner, scopes=bad)
    assert ApiToken.objects.count() == 1


def test_revoking_by_user_leaves_other_users_keys(owner: Any) -> None:
    other = get_user_model().objects.create_user(username="other", password="pw-12345678")
    theirs, raw = issue_token(other)
    assert revoke_token(token_id=theirs.pk, user_id=owner.pk) == 0
    assert find_key(raw) is not None
    assert revoke_token(token_id=theirs.pk, user_id=other.pk) == 1
    assert revoke_token(token_id=theirs.pk, user_id=other.pk) == 0  # once


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("attempt", range(3))
def test_requests_at_once_never_pass_the_limit(settings: Any, attempt: int) -> None:
    """Six threads ask for a key of one user at the same moment, with two places left: two keys."""
    settings.GATEWAY_MAX_API_KEYS_PER_USER = 3
    user = get_user_model().objects.create_user(username=f"racer{attempt}", password="pw-12345678")
    issue_token(user, name="before")
    start = threading.Barrier(6)
    outcomes: list[str] = []

    def ask(n: int) -> None:
        try:
            start.wait()
            issue_token(user, name=f"t{n}")
            outcomes.append("made")
        except KeyRefused:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["made"] * 2 + ["refused"] * 4
    assert ApiToken.objects.filter(user=user, revoked_at__isnull=True).count() == 3
