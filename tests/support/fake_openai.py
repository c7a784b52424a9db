"""A fake OpenAI-compatible chat-completions server for tests.

Real sockets, real HTTP/1.1 and real server-sent events (chunked encoding), on
127.0.0.1 with an ephemeral port. Each request takes the next `Reply` from a
queue the test fills (or `default` when the queue is empty) and is recorded with
its JSON body and the moment the client disconnected, so tests can check what
the gateway sent and that cancelling a run really closed the connection.

A reply may also call tools (`tool_reply`): each `ToolCallReply` is streamed the way
OpenAI streams it, `delta.tool_calls` fragments by `index`: id, type and name in the
first, the arguments split over several more, then `finish_reason: "tool_calls"`.

A vision model (`vision_models`, the model names that take images): an `image_url` part sent to any
other model is answered 400, as real servers answer; one sent to a vision model must be a `data:` URL
of an image that decodes, or it is a 400 too. `Request.images()` describes the images a request carried.

`Reply(echo=True)` answers with what it received instead (`received`: the messages, the
offered tool names, `tool_choice` and every other field of the request, as one JSON text),
so a test that sees only the reply can check what reached the model.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from PIL import Image


@dataclass
class ToolCallReply:
    """One tool call of a reply, as the model streams it."""

    name: str  # the function name (`NAME__tool`)
    arguments: str = "{}"  # the JSON text, sent as is (it may be invalid on purpose)
    id: str | None = None  # default `call_<index>`; "" sends no id at all
    pieces: int = 3  # how many fragments the arguments are split into (fewer for a shorter text)


@dataclass
class Reply:
    """How the fake answers one request."""

    chunks: list[str] = field(default_factory=lambda: ["Hello", " there", "!"])
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # JSON error body for a non-200 status
    headers_delay: float = 0.0  # before the status line (the client waits for headers)
    first_delay: float = 0.0  # after the headers, before the first content chunk
    tick: float = 0.0  # between content chunks
    reasoning: list[str] = field(default_factory=list)  # `reasoning_content` chunks before the answer
    role_chunk: bool = True  # send a role-only chunk right after the headers, as servers do
    stall_after: int | None = None  # after N content chunks, send nothing ever again
    drop_after: int | None = None  # after N content chunks, close the socket mid-body
    stream_error: dict[str, Any] | None = None  # an in-stream `{"error": ...}` event after the chunks
    finish_reason: str | None = "stop"
    refusal: str | None = None
    usage: dict[str, int] | None = None  # sent in a final choice-less chunk, like include_usage
    cached_tokens: int | None = None  # with `usage`: its prompt_tokens_details.cached_tokens
    reasoning_tokens: int | None = None  # with `usage`: its completion_tokens_details.reasoning_tokens
    done: bool = True  # send `data: [DONE]`
    hang_after_done: bool = False  # keep the connection open after [DONE] (a sloppy server)
    keep_alive: bool = True  # else `connection: close` and close after the response
    tool_calls: list[ToolCallReply] = field(default_factory=list)  # streamed after the content chunks
    drop_before_finish: bool = False  # close the socket after chunks and tool calls, before finish_reason
    echo: bool = False  # the content is `received(request)` as JSON, in place of `chunks`


@dataclass
class Request:
    """One request as the fake saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float
    disconnected_at: float | None = None
    completed: bool = False  # the whole response was written
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def tool_names(self) -> list[str]:
        """The function names the request offered the model (`tools`)."""
        return [t["function"]["name"] for t in self.body.get("tools", [])]

    @property
    def tool_choice(self) -> Any:
        return self.body.get("tool_choice")

    def image_parts(self) -> list[tuple[int, dict[str, Any]]]:
        """Every `image_url` part of the request's messages, with the index of its message."""
        found = []
        for i, message in enumerate(self.messages):
            content = message.get("content")
            if isinstance(content, list):
                found += [(i, part) for part in content if isinstance(part, dict) and part.get("type") == "image_url"]
        return found

    def images(self) -> list[dict[str, Any]]:
        """The images the request carried, decoded: message index, type, pixel size, bytes, EXIF present."""
        return [{"message": i, **describe_image(part["image_url"]["url"])} for i, part in self.image_parts()]

    def received(self) -> dict[str, Any]:
        """What the request asked of the model: its messages, tool names, tool_choice, and its other fields
        (model, sampling parameters, ...) under `params`."""
        shown = ("messages", "tools", "tool_choice", "stream", "stream_options")
        return {
            "messages": self.messages,
            "tools": self.tool_names,
            "tool_choice": self.tool_choice,
            "params": {k: v for k, v in self.body.items() if k not in shown},
        }


class FakeOpenAI:
    """The server; `await start()`, point a client at `base_url`, `await stop()`."""

    def __init__(self) -> None:
        self.vision_models: set[str] = set()  # the models that take images (see the module's docstring)
        self.replies: deque[Reply] = deque()
        self.default = Reply()
        self.requests: list[Request] = []
        self.charged: list[dict[str, int]] = []  # the usage of every reply that reported one
        self.request_seen = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def wait_request(self, count: int = 1, timeout: float = 5.0) -> Request:
        """Wait until `count` requests arrived; return the last of them."""
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"expected {count} requests, saw {len(self.requests)}")
            self.request_seen.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.request_seen.wait(), remaining)
        return self.requests[count - 1]

    # --- connection handling ------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            # Keep-alive, like the real servers: a connection may carry several requests,
            # so a client that stops early must close it, not just stop reading.
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                self.request_seen.set()
                reply = self.replies.popleft() if self.replies else self.default
                refused = self._image_problem(request)
                if refused is not None:
                    reply = Reply(status=400, error={"message": refused, "type": "invalid_request_error"})
                respond = asyncio.ensure_future(self._respond(writer, request, reply))
                watcher = asyncio.ensure_future(self._watch(reader, writer, request))
                try:
                    await asyncio.wait({respond, watcher}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for t in (respond, watcher):
                        t.cancel()
                    for t in (respond, watcher):
                        with contextlib.suppress(BaseException):
                            await t
                if respond.done() and not respond.cancelled() and isinstance(respond.exception(), OSError):
                    self._mark_disconnected(request)
                if not request.completed or not reply.keep_alive:
                    return
        except asyncio.CancelledError:
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
            self._handlers.discard(task)

    def _image_problem(self, request: Request) -> str | None:
        """Why a real server would refuse the request's images, or None."""
        parts = request.image_parts()
        if not parts:
            return None
        if request.body.get("model") not in self.vision_models:
            return f"model {request.body.get('model')!r} does not support image input"
        for _i, part in parts:
            try:
                describe_image(part["image_url"]["url"])
            except Exception as exc:  # anything a real server could not read
                return f"invalid image: {exc}"
        return None

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        _method, path, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        raw = await reader.readexactly(length) if length else b""
        body = json.loads(raw) if raw else {}
        return Request(path=path, headers=headers, body=body, received_at=time.monotonic())

    async def _watch(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Request) -> None:
        """Notice the client hanging up, without consuming what it may send next."""
        while not reader.at_eof() and not writer.transport.is_closing():
            await asyncio.sleep(0.01)
        self._mark_disconnected(request)

    @staticmethod
    def _mark_disconnected(request: Request) -> None:
        if request.disconnected_at is None:
            request.disconnected_at = time.monotonic()
            request.disconnected.set()

    # --- responses ---------------------------------------------------------------------------

    async def _respond(self, writer: asyncio.StreamWriter, request: Request, reply: Reply) -> None:
        if reply.headers_delay:
            await asyncio.sleep(reply.headers_delay)
        connection = "" if reply.keep_alive else "connection: close\r\n"
        if reply.status != 200:
            body = json.dumps({"error": reply.error or {"message": f"fake error {reply.status}"}}).encode()
            extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
            writer.write(
                f"HTTP/1.1 {reply.status} Fake\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n{connection}{extra}\r\n".encode()
                + body
            )
            await writer.drain()
            request.completed = True
            return
        extra = "".join(f"{k}: {v}\r\n" for k, v in reply.headers.items())
        writer.write(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            f"transfer-encoding: chunked\r\n{connection}{extra}\r\n".encode()
        )
        await writer.drain()
        model = str(request.body.get("model", "fake"))

        async def event(data: dict[str, Any] | str) -> None:
            text = data if isinstance(data, str) else json.dumps(data)
            payload = f"data: {text}\n\n".encode()
            writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
            await writer.drain()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        if reply.role_chunk:
            await event(chunk({"role": "assistant", "content": ""}))
        if reply.first_delay:
            await asyncio.sleep(reply.first_delay)
        for thought in reply.reasoning:
            await event(chunk({"reasoning_content": thought}))
            await asyncio.sleep(reply.tick)
        chunks = [json.dumps(request.received())] if reply.echo else reply.chunks
        for i, piece in enumerate(chunks):
            if i and reply.tick:
                await asyncio.sleep(reply.tick)
            if reply.stall_after is not None and i >= reply.stall_after:
                await asyncio.Event().wait()
            if reply.drop_after is not None and i >= reply.drop_after:
                writer.transport.abort()  # mid-body: no terminating chunk
                return
            await event(chunk({"content": piece}))
        if reply.stall_after is not None and reply.stall_after >= len(chunks):
            await asyncio.Event().wait()
        if reply.drop_after is not None and reply.drop_after >= len(chunks):
            writer.transport.abort()
            return
        for index, call in enumerate(reply.tool_calls):
            for delta in _tool_fragments(index, call):
                if reply.tick:
                    await asyncio.sleep(reply.tick)
                await event(chunk({"tool_calls": [delta]}))
        if reply.drop_before_finish:
            writer.transport.abort()
            return
        if reply.stream_error is not None:
            await event({"error": reply.stream_error})
        else:
            if reply.refusal is not None:
                await event(chunk({"refusal": reply.refusal}))
            if reply.finish_reason is not None:
                await event(chunk({}, reply.finish_reason))
            if reply.usage is not None:
                details: dict[str, Any] = {}
                if reply.cached_tokens is not None:
                    details["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
                if reply.reasoning_tokens is not None:
                    details["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
                self.charged.append(dict(reply.usage))  # what the model bills for: the usage it reports
                await event(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": model,
                        "choices": [],
                        "usage": {**reply.usage, "total_tokens": sum(reply.usage.values()), **details},
                    }
                )
            if reply.done:
                await event("[DONE]")
        if reply.hang_after_done:
            await asyncio.Event().wait()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        request.completed = True


def _tool_fragments(index: int, call: ToolCallReply) -> list[dict[str, Any]]:
    """The `delta.tool_calls` entries of one call: id and name first, then the arguments in pieces."""
    head: dict[str, Any] = {"index": index, "type": "function", "function": {"name": call.name, "arguments": ""}}
    call_id = f"call_{index}" if call.id is None else call.id
    if call_id:
        head["id"] = call_id
    args = call.arguments
    size = max(1, -(-len(args) // max(1, call.pieces)))
    pieces = [args[i : i + size] for i in range(0, len(args), size)]
    return [head, *({"index": index, "function": {"arguments": piece}} for piece in pieces)]


def tool_reply(*calls: ToolCallReply, chunks: list[str] | None = None, **options: Any) -> Reply:
    """A reply that calls tools (after any text in `chunks`) and ends with `finish_reason: "tool_calls"`."""
    options.setdefault("finish_reason", "tool_calls")
    return Reply(chunks=list(chunks or []), tool_calls=list(calls), **options)


@contextlib.asynccontextmanager
async def running_fake() -> AsyncIterator[FakeOpenAI]:
    """A started fake server, stopped on exit."""
    from chat.runtime.backends.openai.clients import close_clients

    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await close_clients()  # pooled keep-alive connections belong to this test's loop
        await server.stop()


def describe_image(url: str) -> dict[str, Any]:
    """A `data:` URL's image: its type, pixel size, byte count and whether it carries EXIF."""
    head, _, data = url.partition(",")
    if not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError("not a base64 data: URL of an image")
    raw = base64.b64decode(data, validate=True)
    with Image.open(io.BytesIO(raw)) as image:
        image.load()
        return {
            "mime": head[5:].split(";")[0],
            "format": image.format,
            "width": image.width,
            "height": image.height,
            "bytes": len(raw),
            "exif": bool(image.getexif()) or "exif" in image.info,
        }


def agent_config(fake: FakeOpenAI, **overrides: Any) -> dict[str, Any]:
    """An `openai` agent pointed at the fake, with test-sized timeouts and backoff."""
    config: dict[str, Any] = {
        "backend": "openai",
        "model": "fake-model",
        "base_url": fake.base_url,
        "first_token_timeout_ms": 2000,
        "idle_timeout_ms": 2000,
        "retry_backoff_ms": 20,
    }
    config.update(overrides)
    return config


def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
