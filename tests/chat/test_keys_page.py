"""The API keys page (/api/keys): a user makes, lists and revokes their own keys (HTTP-API.md §14.1).

Through Django's test client with its middleware (sessions, CSRF, messages) and the real database;
a revocation from the page closes the key's open WebSocket (the real consumer)."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from chat.websocket import handshake
from sessions_app.models import ApiToken
from sessions_app.tokens import find_key, hash_token, issue_token
from tests.support.communicator import open_client

pytestmark = pytest.mark.django_db

URL = "/api/keys"
RAW_RE = re.compile(r'value="(agt_[A-Za-z0-9_-]+)"')


def _user(username: str = "kim", *, staff: bool = False) -> Any:
    return get_user_model().objects.create_user(username=username, password="pw-12345678", is_staff=staff)


def _client(user: Any, *, csrf: bool = False) -> HttpClient:
    http = HttpClient(enforce_csrf_checks=csrf)
    http.force_login(user)
    return http


def _create(http: HttpClient, name: str = "laptop", scopes: tuple[str, ...] = ("read", "write")) -> Any:
    return http.post(URL, {"name": name, "scopes": list(scopes)})


def _raw_of(response: Any) -> str:
    match = RAW_RE.search(response.content.decode())
    assert match, "the new key is not on the page"
    return match.group(1)


def test_a_new_key_is_shown_once_and_the_list_never_shows_it() -> None:
    user = _user()
    http = _client(user)
    empty = http.get(URL)
    assert empty.status_code == HTTPStatus.OK and 'data-testid="no-keys"' in empty.content.decode()
    made = _create(http, "laptop", ("read", "write"))
    assert made.status_code == HTTPStatus.CREATED
    assert "no-store" in made["Cache-Control"]
    raw = _raw_of(made)
    page = made.content.decode()
    assert "will not be shown again" in page and 'data-testid="copy-key"' in page
    token = ApiToken.objects.get(user=user)
    assert token.name == "laptop" and token.scopes == ["read", "write"] and token.token_hash == hash_token(raw)
    holder = find_key(raw)
    assert holder is not None and holder.user_id == user.pk and holder.scopes == {"read", "write"}

    later = http.get(URL).content.decode()
    assert raw not in later and token.token_hash not in later
    assert token.prefix in later and "laptop" in later and "read, write" in later and "never" in later
    assert 'data-testid="new-key"' not in later


def test_the_form_offers_the_default_scopes_and_admin_only_to_staff() -> None:
    page = _client(_user()).get(URL).content.decode()
    checked = set(re.findall(r'value="(\w+)" data-testid="scope-\w+" checked', page))
    assert checked == {"read", "write", "approvals"}
    assert 'data-testid="scope-admin"' not in page
    staff_page = _client(_user("sam", staff=True)).get(URL).content.decode()
    assert 'data-testid="scope-admin"' in staff_page


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"name": "", "scopes": ["read"]}, "Give the key a name"),
        ({"name": "   ", "scopes": ["read"]}, "Give the key a name"),
        ({"name": "x" * 101, "scopes": ["read"]}, "longer than 100 characters"),
        ({"name": "bad\x07name", "scopes": ["read"]}, "control characters"),
        ({"name": "ok", "scopes": ["write"]}, "every key has the read scope"),
        ({"name": "ok"}, "every key has the read scope"),
        ({"name": "ok", "scopes": ["read", "root"]}, "unknown scope"),
        ({"name": "ok", "scopes": ["read", "admin"]}, "only a staff user"),
    ],
)
def test_bad_input_is_a_clear_error_and_makes_nothing(form: dict[str, Any], message: str) -> None:
    http = _client(_user())
    res = http.post(URL, form)
    assert res.status_code == HTTPStatus.BAD_REQUEST
    page = res.content.decode()
    assert 'data-testid="key-error"' in page and message.lower() in page.lower()
    assert not RAW_RE.search(page)
    assert not ApiToken.objects.exists()


def test_a_staff_user_may_give_a_key_admin() -> None:
    staff = _user("sam", staff=True)
    res = _create(_client(staff), "ops", ("read", "write", "approvals", "admin"))
    assert res.status_code == HTTPStatus.CREATED
    assert ApiToken.objects.get(user=staff).scopes == ["read", "write", "approvals", "admin"]


def test_at_most_the_limit_of_active_keys(settings: Any) -> None:
    settings.GATEWAY_MAX_API_KEYS_PER_USER = 2
    user = _user()
    http = _client(user)
    assert _create(http, "one").status_code == HTTPStatus.CREATED
    assert _create(http, "two").status_code == HTTPStatus.CREATED
    refused = _create(http, "three")
    assert refused.status_code == HTTPStatus.BAD_REQUEST
    assert "At most 2 active keys per user" in refused.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 2
    one = ApiToken.objects.get(name="one")
    assert http.post(f"{URL}/{one.pk}/revoke").status_code == HTTPStatus.SEE_OTHER
    assert _create(http, "three").status_code == HTTPStatus.CREATED  # a revoked key leaves a place


def test_revoke_an_own_key_and_nobody_elses() -> None:
    kim, lee = _user("kim"), _user("lee")
    mine, raw = issue_token(kim, name="ci")
    theirs, their_raw = issue_token(lee, name="theirs")
    http = _client(kim)
    for other in (theirs.pk, 999_999):  # another user's key is as unknown as a missing one: 404
        assert http.post(f"{URL}/{other}/revoke").status_code == HTTPStatus.NOT_FOUND
    assert find_key(their_raw) is not None
    assert http.get(f"{URL}/{mine.pk}/revoke").status_code == HTTPStatus.METHOD_NOT_ALLOWED
    res = http.post(f"{URL}/{mine.pk}/revoke")
    assert res.status_code == HTTPStatus.SEE_OTHER and res["Location"] == URL
    assert find_key(raw) is None
    page = http.get(URL).content.decode()
    assert f"Revoked {mine.prefix}… (ci)" in page and 'data-state="revoked"' in page
    again = http.post(f"{URL}/{mine.pk}/revoke", follow=True).content.decode()
    assert "Revoked" not in again  # already revoked: nothing more to say


def test_posts_need_the_csrf_token() -> None:
    user = _user()
    http = _client(user, csrf=True)
    token, raw = issue_token(user, name="kept")
    assert _create(http, "forged").status_code == HTTPStatus.FORBIDDEN
    assert http.post(f"{URL}/{token.pk}/revoke").status_code == HTTPStatus.FORBIDDEN
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["kept"] and find_key(raw) is not None
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', http.get(URL).content.decode())
    assert csrf
    res = http.post(URL, {"name": "real", "scopes": ["read"], "csrfmiddlewaretoken": csrf.group(1)})
    assert res.status_code == HTTPStatus.CREATED


def test_the_page_needs_a_login_and_the_chat_page_links_to_it() -> None:
    anonymous = HttpClient()
    assert anonymous.get(URL).status_code == HTTPStatus.FOUND
    assert anonymous.post(URL, {"name": "x", "scopes": ["read"]}).status_code == HTTPStatus.FOUND
    assert not ApiToken.objects.exists()
    chat = _client(_user()).get("/").content.decode()
    assert f'href="{URL}"' in chat and 'data-testid="api-keys-link"' in chat


@pytest.mark.django_db(transaction=True)
async def test_revoking_on_the_page_closes_the_keys_websocket() -> None:
    user = await database_sync_to_async(_user)()
    http = await database_sync_to_async(_client)(user)
    made = await database_sync_to_async(_create)(http, "socket", ("read", "write"))
    raw = _raw_of(made)
    ws = await open_client(raw, subscribe=False)
    assert ws.hello["auth"]["scopes"] == ["operator.read", "operator.write"]
    token = await database_sync_to_async(ApiToken.objects.get)(user=user)
    assert token.last_used_at is not None  # the handshake noted its use
    res = await database_sync_to_async(http.post)(f"{URL}/{token.pk}/revoke")
    assert res.status_code == HTTPStatus.SEE_OTHER
    assert await ws.wait_closed(timeout=2) == handshake.CLOSE_POLICY
