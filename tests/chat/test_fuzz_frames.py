"""Property test: random frames get exactly one well-formed response, the socket survives,
and a request that fails stores nothing."""

import json

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.support.communicator import open_client
from tests.support.db import counts

pytestmark = pytest.mark.django_db(transaction=True)

METHODS = [
    "chat.send",
    "chat.abort",
    "chat.history",
    "sessions.list",
    "sessions.create",
    "sessions.patch",
    "sessions.reset",
    "sessions.delete",
    "sessions.steer",
    "sessions.subscribe",
    "health",
    "connect",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2_000_000),
    st.text(max_size=30),
    st.sampled_from(["main", "agent:main:x", "agent:ghost:x", "", "a b", "/stop", "[[hang]]"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
param_keys = st.sampled_from(
    [
        "sessionKey",
        "message",
        "idempotencyKey",
        "runId",
        "limit",
        "offset",
        "label",
        "timeoutMs",
        "waitMs",
        "queueMode",
        "attachments",
        "beforeId",
        "status",
        "x",
    ]
)
params = st.dictionaries(param_keys, values, max_size=6)
requests = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["req", "req", "req", "res", "event", 3]),
        "id": st.one_of(st.text(min_size=1, max_size=12), st.integers(), st.just("")),
        "method": st.one_of(st.sampled_from(METHODS), st.text(max_size=10)),
    },
    optional={"params": st.one_of(params, values), "extra": values},
)
frames = st.one_of(requests.map(json.dumps), values.map(json.dumps), st.text(min_size=1, max_size=40))


@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(frames, min_size=1, max_size=12))
async def test_random_frames(alice, settings, batch):
    settings.GATEWAY_RATE_PER_SEC = 10_000
    settings.GATEWAY_RATE_BURST = 10_000
    c = await open_client(alice[1], subscribe=False)
    for i, text in enumerate(batch):
        before = await counts()
        try:
            frame = json.loads(text)
        except ValueError:
            frame = None
        readable_id = isinstance(frame, dict) and isinstance(frame.get("id"), str) and 1 <= len(frame["id"]) <= 128
        # make ids unique per frame so responses can be matched
        if readable_id:
            frame["id"] = f"f{i}-{frame['id']}"
            text = json.dumps(frame)
        await c.send_raw(text)
        rid = frame["id"] if readable_id else "invalid"
        res = await c.response(rid, timeout=5)
        assert res["type"] == "res" and isinstance(res["ok"], bool)
        if not res["ok"]:
            err = res["error"]
            assert err["code"] in {
                "INVALID_REQUEST",
                "UNAUTHORIZED",
                "FORBIDDEN",
                "NOT_FOUND",
                "CONFLICT",
                "RATE_LIMITED",
                "PAYLOAD_TOO_LARGE",
                "UNAVAILABLE",
            }, err
            assert isinstance(err["message"], str) and "Traceback" not in err["message"]
            if res.get("payload", {}).get("status") != "error":  # an error ack persists its failed run
                assert await counts() == before, (text, res)
        assert c.closed is None
        assert not c.responses  # exactly one response per request
    assert (await c.ok("health"))["ok"] is True
    await c.close()
