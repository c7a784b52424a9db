import pytest

pytestmark = pytest.mark.django_db(transaction=True)


async def test_send_streams_and_finishes(client):
    ack = await client.ok("chat.send", {"sessionKey": "main", "message": "hello world", "idempotencyKey": "k1"})
    assert ack["status"] == "started"
    final = await client.wait_terminal("k1")
    assert final["state"] == "final"
    assert final["message"]["content"][0]["text"] == "echo: hello world"
    rows = await client.ok("sessions.list", {})
    assert rows["sessions"][0]["status"] == "done"
    again = await client.ok("chat.send", {"sessionKey": "main", "message": "hello world", "idempotencyKey": "k1"})
    assert again["status"] == "ok" and again["reply"] == "echo: hello world"
