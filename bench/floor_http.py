"""The HTTP floor: a bare asyncio HTTP/1.1 server answering `POST /v1/chat/completions` as the
gateway's scripted agent would, so the HTTP rows of `make bench` have a floor like the WebSocket ones.

No Django, no database, no run: read the request (keep-alive, `Content-Length` bodies), answer
`echo: <the last user message without its [[directives]]>` whole (`chat.completion`) or as a
`text/event-stream` (role chunk, the text in one chunk, the finish chunk, `[DONE]`, chunked
transfer encoding) — the same bytes on the wire, near enough, as the gateway's answer to a
`[[tick:0]]` turn. Any bearer token is accepted. `bench/floor_server.py --http-port N` serves it
beside the WebSocket floor, in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from typing import Any

DIRECTIVE_RE = re.compile(r"\[\[[^\]]*\]\]")
MAX_BODY = 20 * 1024 * 1024


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _reply(body: dict[str, Any]) -> str:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
    text = messages[-1].get("content", "") if messages else ""
    return "echo: " + " ".join(DIRECTIVE_RE.sub("", text if isinstance(text, str) else "").split())


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "OK")
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


def _whole(status: int, payload: Any) -> bytes:
    data = _dumps(payload)
    return _head(status, {"content-type": "application/json", "content-length": str(len(data))}) + data


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _completion(body: dict[str, Any]) -> list[bytes]:
    """The answer's pieces (one for JSON; head and chunks for a stream)."""
    ident = {"id": f"chatcmpl-{uuid.uuid4().hex[:29]}", "created": int(time.time()), "model": body.get("model")}
    text = _reply(body)
    words = len(text.split())
    usage = {"prompt_tokens": words, "completion_tokens": words, "total_tokens": 2 * words}
    if not body.get("stream"):
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        return [_whole(200, {**ident, "object": "chat.completion", "choices": [choice], "usage": usage})]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + _dumps({**ident, "object": "chat.completion.chunk", "choices": [choice]}) + b"\n\n"

    sse = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
    head = _head(200, {**sse, "transfer-encoding": "chunked"})
    events = [chunk({"role": "assistant", "content": ""}), chunk({"content": text}), chunk({}, "stop")]
    events.append(b"data: [DONE]\n\n")
    return [head, *(_chunk(e) for e in events), b"0\r\n\r\n"]


async def _request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    """(method, path, body) of the next request on the connection; None when it closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = min(int(value.strip() or 0), MAX_BODY)
    body = await reader.readexactly(length) if length else b""
    return method, path, body


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One connection: requests answered one after another until the client closes it."""
    try:
        while (request := await _request(reader)) is not None:
            method, path, raw = request
            if method == "POST" and path == "/v1/chat/completions":
                pieces = _completion(json.loads(raw or b"{}"))
            elif method == "GET" and path == "/v1/models":
                pieces = [_whole(200, {"object": "list", "data": [{"id": "main", "object": "model"}]})]
            else:
                pieces = [_whole(404, {"error": {"message": "no such endpoint", "type": "not_found_error"}})]
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
            await writer.wait_closed()
