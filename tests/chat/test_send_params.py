"""`chat.send` params, validated completely before anything is stored (no database)."""

import base64

import pytest

from chat.methods.send import params as send_parsing
from chat.protocol.errors import ProtocolError
from tests.support import files as made
from tests.support.db import send_params


def _send(**over: object) -> dict:
    """A valid chat.send's params with some fields replaced (or set to bad values)."""
    return {**send_params("main", "hi", "k"), **over}


@pytest.mark.parametrize(
    "params, field",
    [
        (_send(message=5), "message"),
        (_send(message="a\x00b"), "message"),
        (_send(message=""), "message"),
        (_send(message="x" * 32001), "message"),
        (_send(sessionKey=None), "sessionKey"),
        (_send(idempotencyKey=""), "idempotencyKey"),
        (_send(idempotencyKey="a" * 129), "idempotencyKey"),
        (_send(idempotencyKey="a b"), "idempotencyKey"),
        (_send(timeoutMs=999), "timeoutMs"),
        (_send(timeoutMs="1000"), "timeoutMs"),
        (_send(waitMs=120001), "waitMs"),
        (_send(queueMode="later"), "queueMode"),
        (_send(attachments={}), "attachments"),
        (_send(attachments=[{"mimeType": "application/pdf", "content": "AAAA"}]), "attachments[0].mimeType"),
        (_send(attachments=[{"mimeType": "image/png", "content": "!!!"}]), "attachments[0].content"),
        (
            _send(attachments=[{"mimeType": "image/png", "content": base64.b64encode(b"hello").decode()}]),
            "attachments[0].mimeType",
        ),
        (
            _send(attachments=[{"mimeType": "text/plain", "content": base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()}]),
            "attachments[0].mimeType",
        ),
        (_send(attachments=[{"mimeType": "text/plain", "content": "aGk="}] * 5), "attachments"),
    ],
)
def test_chat_send_validation(params: dict, field: str, settings: object) -> None:
    with pytest.raises(ProtocolError) as err:
        send_parsing.parse_chat_send(params)
    assert err.value.code == "INVALID_REQUEST"
    assert err.value.details["field"] == field


def test_control_chars_are_stripped_and_attachments_sniffed() -> None:
    image = made.png(4, 4)
    png = base64.b64encode(image).decode()
    parsed = send_parsing.parse_chat_send(
        _send(message="a\x07b\tc\n", attachments=[{"mimeType": "image/png", "content": png, "fileName": "x.png"}])
    )
    assert parsed.message == "ab\tc\n"
    assert parsed.attachments[0]["size"] == len(image) and parsed.attachments[0]["mimeType"] == "image/png"
    # the magic bytes alone do not make an image: it must be one Pillow can read
    fake = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8).decode()
    with pytest.raises(ProtocolError) as refused:
        send_parsing.parse_chat_send(_send(message="x", attachments=[{"mimeType": "image/png", "content": fake}]))
    assert refused.value.details["reason"] == "bad-image"


def test_empty_message_allowed_with_attachment() -> None:
    parsed = send_parsing.parse_chat_send(
        _send(message="", attachments=[{"mimeType": "text/plain", "content": "aGk="}])
    )
    assert parsed.message == "" and len(parsed.attachments) == 1


def test_body_hash_distinguishes_messages() -> None:
    a = send_parsing.parse_chat_send(_send(message="a")).body_hash
    b = send_parsing.parse_chat_send(_send(message="b")).body_hash
    assert a != b and a == send_parsing.parse_chat_send(_send(message="a")).body_hash


@pytest.mark.parametrize(
    "msg, cmd, arg",
    [
        ("/stop", "/stop", None),
        (" /new ", "/new", None),
        ("/reset", "/reset", None),
        ("/stop now", None, None),
        ("/think", "/think", None),
        ("/think HIGH", "/think", "high"),
        ("/think default", "/think", ""),
        # a command word and a sentence: a message for the model
        ("/think about this bug", None, None),
        ("/model is great", None, None),
        ("/verbose on please", None, None),
    ],
)
def test_commands(msg: str, cmd: str | None, arg: str | None) -> None:
    parsed = send_parsing.parse_chat_send(_send(message=msg))
    assert (parsed.command, parsed.command_arg) == (cmd, arg)


@pytest.mark.parametrize("msg", ["/think hgih", "/verbose loud", "/model gpt-9"])
def test_a_command_with_one_bad_argument_is_refused(msg: str) -> None:
    with pytest.raises(ProtocolError) as err:
        send_parsing.parse_chat_send(_send(message=msg))
    assert (err.value.code, err.value.details["field"]) == ("INVALID_REQUEST", "message")
