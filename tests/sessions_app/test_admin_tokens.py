"""The API keys admin: add a key with scopes (shown once), the rules every new key meets, revoke
(closing open connections), filters and search, fixed query counts, never a hash to copy."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chat.websocket import handshake
from sessions_app.admin.tokens import ApiTokenAdmin
from sessions_app.models import ApiToken
from sessions_app.tokens import find_key, hash_token, issue_token
from tests.support import opsdata
from tests.support.communicator import open_client

pytestmark = pytest.mark.django_db

ADD = "admin:sessions_app_apitoken_add"
CHANGELIST = "admin:sessions_app_apitoken_changelist"


def _listed(client: Client, query: str = "") -> list[str]:
    res = client.get(reverse(CHANGELIST) + query)
    assert res.status_code == HTTPStatus.OK
    return [key.name for key in res.context["cl"].result_list]


def test_a_key_added_for_a_user_is_shown_once_with_its_scopes(admin_client: Client) -> None:
    owner = opsdata.user("tok-owner")
    form = admin_client.get(reverse(ADD)).content.decode()
    checked = set(re.findall(r'name="scopes" value="(\w+)"[^>]*checked', form))
    assert checked == {"read", "write", "approvals"}  # the default scopes, offered checked
    res = admin_client.post(reverse(ADD), {"user": owner.pk, "name": "ci", "scopes": ["read"]})
    assert res.status_code == HTTPStatus.OK and "no-store" in res["Cache-Control"]
    raw = res.context["raw_token"]
    assert raw.startswith("agt_") and raw in res.content.decode()
    token = ApiToken.objects.get()
    assert token.token_hash == hash_token(raw) and token.name == "ci" and token.scopes == ["read"]
    holder = find_key(raw)
    assert holder is not None and holder.user_id == owner.pk and holder.scopes == {"read"}
    assert LogEntry.objects.filter(object_id=str(token.pk), action_flag=ADDITION).exists()
    page = admin_client.get(reverse("admin:sessions_app_apitoken_change", args=[token.pk])).content.decode()
    assert raw not in page and token.token_hash not in page and f"{token.prefix}…" in page
    assert 'name="_save"' not in page  # a made key is only looked at: nothing to edit
    listing = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert raw not in listing and token.token_hash not in listing


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"name": "x", "scopes": ["write"]}, "every key has the read scope"),
        ({"name": "x", "scopes": ["read", "admin"]}, "only a staff user"),
        ({"name": "x\x01", "scopes": ["read"]}, "control characters"),
    ],
)
def test_a_key_that_breaks_a_rule_is_refused_with_the_reason(
    admin_client: Client, form: dict[str, Any], error: str
) -> None:
    owner = opsdata.user("tok-owner")
    res = admin_client.post(reverse(ADD), {"user": owner.pk, **form})
    assert res.status_code == HTTPStatus.OK and error in res.content.decode()
    assert "raw_token" not in res.context
    assert not ApiToken.objects.exists()


def test_a_staff_users_key_may_have_admin(admin_client: Client) -> None:
    staff = opsdata.user("ops", is_staff=True)
    res = admin_client.post(reverse(ADD), {"user": staff.pk, "name": "ops", "scopes": ["read", "admin"]})
    assert res.status_code == HTTPStatus.OK and res.context["raw_token"]
    assert ApiToken.objects.get(user=staff).scopes == ["read", "admin"]


def test_the_limit_of_active_keys_holds_in_the_admin_too(admin_client: Client, settings: Any) -> None:
    settings.GATEWAY_MAX_API_KEYS_PER_USER = 1
    owner = opsdata.user("tok-owner")
    issue_token(owner, name="first")
    res = admin_client.post(reverse(ADD), {"user": owner.pk, "name": "second", "scopes": ["read"]})
    assert res.status_code == HTTPStatus.OK and "at most 1 active keys per user" in res.content.decode()
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["first"]


def test_a_place_taken_between_the_check_and_the_save_makes_no_key(
    admin_client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another request takes the user's last place after the form's check: said, and nothing made."""
    settings.GATEWAY_MAX_API_KEYS_PER_USER = 1
    owner = opsdata.user("tok-owner")
    save_form = ApiTokenAdmin.save_form

    def meanwhile(self: Any, request: Any, form: Any, change: bool) -> Any:
        issue_token(owner, name="other request")  # after the form's check, before the save
        return save_form(self, request, form, change)

    monkeypatch.setattr(ApiTokenAdmin, "save_form", meanwhile)
    res = admin_client.post(reverse(ADD), {"user": owner.pk, "name": "late", "scopes": ["read"]}, follow=True)
    assert "No key made: at most 1 active keys per user" in res.content.decode()
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["other request"]
    assert not LogEntry.objects.filter(action_flag=ADDITION).exists()


def test_staff_can_only_mint_keys_for_themselves() -> None:
    client = Client()
    staff = get_user_model().objects.create_user("sam", password="pw-12345678", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["add_apitoken", "view_apitoken"]))
    root = get_user_model().objects.create_superuser("root", password="pw-12345678")
    client.force_login(staff)
    res = client.post(reverse(ADD), {"user": root.pk, "name": "stolen", "scopes": ["read"]})
    assert res.status_code == HTTPStatus.OK and "Select a valid choice" in res.content.decode()
    assert not ApiToken.objects.filter(user=root).exists()
    res = client.post(reverse(ADD), {"user": staff.pk, "name": "mine", "scopes": ["read"]})
    assert res.status_code == HTTPStatus.OK and ApiToken.objects.filter(user=staff, name="mine").exists()


def test_keys_are_revoked_never_deleted(admin_client: Client) -> None:
    owner = opsdata.user("tok-owner")
    token, raw = issue_token(owner)
    res = admin_client.post(
        reverse(CHANGELIST), {"action": "delete_selected", "_selected_action": [token.pk], "post": "yes"}
    )
    assert res.status_code in (HTTPStatus.OK, HTTPStatus.FOUND)
    page = admin_client.post(reverse("admin:sessions_app_apitoken_delete", args=[token.pk]), {"post": "yes"})
    assert page.status_code == HTTPStatus.FORBIDDEN
    assert find_key(raw) is not None


@pytest.mark.django_db(transaction=True)
async def test_the_revoke_action_closes_the_keys_connections(admin_client: Client) -> None:
    owner = await database_sync_to_async(opsdata.user)("tok-owner")
    (gone, gone_raw), (_kept, kept_raw) = [await database_sync_to_async(issue_token)(owner, name=n) for n in "ab"]
    closing, staying = await open_client(gone_raw, subscribe=False), await open_client(kept_raw, subscribe=False)
    res = await database_sync_to_async(admin_client.post)(
        reverse(CHANGELIST), {"action": "revoke", "_selected_action": [gone.pk], "index": "0"}
    )
    assert res.status_code == HTTPStatus.FOUND
    assert await closing.wait_closed(timeout=2) == handshake.CLOSE_POLICY
    assert (await staying.ok("health", {}))["ok"] is True
    await staying.close()
    assert await database_sync_to_async(find_key)(gone_raw) is None
    assert await database_sync_to_async(find_key)(kept_raw) is not None
    logged = LogEntry.objects.filter(object_id=str(gone.pk), action_flag=CHANGE)
    assert await database_sync_to_async(logged.exists)()


@pytest.fixture
def keys() -> dict[str, ApiToken]:
    """Keys of two users, one per situation the filters tell apart."""
    ann, bob = opsdata.user("ann-keys"), opsdata.user("bob-keys", is_staff=True)
    made = {
        "ann-default": issue_token(ann, name="ann-default")[0],
        "ann-read": issue_token(ann, name="ann-read", scopes=["read"])[0],
        "ann-approvals": issue_token(ann, name="ann-approvals", scopes=["read", "approvals"])[0],
        "bob-admin": issue_token(bob, name="bob-admin", scopes=["read", "write", "admin"])[0],
        "bob-revoked": issue_token(bob, name="bob-revoked", scopes=["read"])[0],
    }
    ApiToken.objects.filter(pk=made["bob-revoked"].pk).update(revoked_at=timezone.now())
    return made


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ["bob-revoked", "bob-admin", "ann-approvals", "ann-read", "ann-default"]),
        ("?state=active", ["bob-admin", "ann-approvals", "ann-read", "ann-default"]),
        ("?state=revoked", ["bob-revoked"]),
        ("?scope=admin", ["bob-admin"]),
        ("?scope=approvals", ["ann-approvals", "ann-default"]),
        ("?scope=write", ["bob-admin", "ann-default"]),
        ("?scope=read-only", ["bob-revoked", "ann-read"]),
        ("?scope=read-only&state=active", ["ann-read"]),
        ("?q=bob", ["bob-revoked", "bob-admin"]),
        ("?q=ANN-K", ["ann-approvals", "ann-read", "ann-default"]),
        ("?q=nobody", []),
    ],
)
def test_filters_and_search(admin_client: Client, keys: dict[str, ApiToken], query: str, expected: list[str]) -> None:
    assert _listed(admin_client, query) == expected


def test_search_by_prefix(admin_client: Client, keys: dict[str, ApiToken]) -> None:
    key = keys["ann-read"]
    assert _listed(admin_client, f"?q={key.prefix}") == ["ann-read"]
    # one character off (whatever its case: SQLite's LIKE ignores case) matches nothing
    other = "0" if key.prefix[-1] != "0" else "1"
    assert _listed(admin_client, f"?q={key.prefix[:-1]}{other}") == []


@pytest.mark.parametrize("query", ["", "?state=active", "?scope=admin", "?q=user"])
def test_the_list_runs_the_same_queries_for_more_keys(admin_client: Client, query: str) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(CHANGELIST) + query).status_code == HTTPStatus.OK
        return len(captured.captured_queries)

    def make(users: int, each: int) -> None:
        for u in range(users):
            user = opsdata.user(f"user-{u}", is_staff=True)
            for k in range(each):
                issue_token(user, name=f"k{k}", scopes=["read", "admin"] if k % 2 else None)

    make(2, 2)
    small = count()
    make(12, 10)
    assert count() == small
