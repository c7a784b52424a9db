"""API tokens: only the hash is stored; revoked tokens and inactive users authenticate nobody."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import ApiToken
from sessions_app.tokens import authenticate_token, hash_token, issue_token, revoke_token, still_authorized

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
