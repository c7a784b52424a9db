"""The floor: a bare `websockets` server speaking the minimal protocol subset the load client uses.

It is what the gateway is measured against in the same run (`bench/run.py`): no
Django, no database, no channel layer, just the frames. The subset:

- on open, event `connect.challenge`; first frame `connect` -> `hello-ok`
  (any `auth.token` is accepted and names the user: connections with the same
  token are one user, and every event of that user's runs fans out to all of them);
- `sessions.subscribe` / `sessions.unsubscribe` -> `{subscribed}`; subscribed
  connections get `sessions.changed` when a run starts and when it ends;
- `chat.send` -> ack `started`, then `chat` delta events (coalesced to one per
  GATEWAY_DELTA_INTERVAL_MS like the gateway, default 50 ms) and a `final`, each
  with the run's `seq`; the scripted agent's `[[tick:MS]]` and `[[words:N]]` apply;
- `chat.send` again with a finished idempotencyKey -> ack `ok` with the reply, from
  an in-memory dict; with a different message -> `CONFLICT`; while running -> `in_flight`.

With `--http-port`, the HTTP floor (`bench/floor_http.py`: `POST /v1/chat/completions`) too.

    .venv/bin/python bench/floor_server.py --port 8765 [--http-port 8766]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import floor_http

DIRECTIVE_RE = re.compile(r"\[\[(delay|tick|words|fail|hang)(?::([A-Za-z0-9]+))?\]\]")
DELTA_INTERVAL = int(os.environ.get("GATEWAY_DELTA_INTERVAL_MS", "50")) / 1000
METHODS = ["health", "chat.send", "sessions.subscribe", "sessions.unsubscribe"]


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"))


@dataclass(eq=False)
class Conn:
    ws: ServerConnection
    user: str
    seq: int = 0
    subscribed: bool = False

    async def event(self, name: str, payload: dict[str, Any]) -> None:
        self.seq += 1
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(dumps({"type": "event", "event": name, "payload": payload, "seq": self.seq}))


@dataclass
class RunRecord:
    message: str
    reply: str = ""
    done: bool = False


@dataclass
class Session:
    key: str
    session_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    version: int = 1
    runs: dict[str, RunRecord] = field(default_factory=dict)


class Floor:
    def __init__(self) -> None:
        self.users: dict[str, set[Conn]] = {}
        self.sessions: dict[tuple[str, str], Session] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    async def handler(self, ws: ServerConnection) -> None:
        await ws.send(
            dumps(
                {
                    "type": "event",
                    "event": "connect.challenge",
                    "payload": {"nonce": secrets.token_hex(16), "ts": now_ms()},
                    "seq": 1,
                }
            )
        )
        try:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        except (TimeoutError, ConnectionClosed, ValueError):
            await ws.close(4008)
            return
        params = first.get("params") or {}
        token = (params.get("auth") or {}).get("token")
        if first.get("method") != "connect" or not isinstance(token, str) or not token:
            await ws.send(
                dumps(
                    {
                        "type": "res",
                        "id": str(first.get("id", "invalid")),
                        "ok": False,
                        "error": {"code": "UNAUTHORIZED", "message": "authentication required"},
                    }
                )
            )
            await ws.close(4008)
            return
        conn = Conn(ws, token, seq=1)
        self.users.setdefault(token, set()).add(conn)
        hello = {
            "type": "hello-ok",
            "protocol": 4,
            "server": {"version": "floor", "connId": uuid.uuid4().hex},
            "features": {"methods": METHODS, "events": ["chat", "sessions.changed", "tick"]},
            "auth": {"role": "operator", "scopes": ["operator.read", "operator.write"], "user": token},
        }
        await ws.send(dumps({"type": "res", "id": first["id"], "ok": True, "payload": hello}))
        try:
            async for text in ws:
                frame = json.loads(text)
                await self.dispatch(conn, frame)
        except ConnectionClosed:
            pass
        finally:
            self.users[token].discard(conn)

    async def dispatch(self, conn: Conn, frame: dict[str, Any]) -> None:
        rid = frame.get("id", "invalid")
        method = frame.get("method")
        params = frame.get("params") or {}
        if method == "chat.send":
            payload, error = self.chat_send(conn, params)
            res: dict[str, Any] = {"type": "res", "id": rid, "ok": error is None, "payload": payload}
            if error is not None:
                res["error"] = error
            await conn.ws.send(dumps(res))
        elif method in ("sessions.subscribe", "sessions.unsubscribe"):
            conn.subscribed = method == "sessions.subscribe"
            await conn.ws.send(
                dumps({"type": "res", "id": rid, "ok": True, "payload": {"subscribed": conn.subscribed}})
            )
        elif method == "health":
            await conn.ws.send(dumps({"type": "res", "id": rid, "ok": True, "payload": {"ok": True, "ts": now_ms()}}))
        else:
            await conn.ws.send(
                dumps(
                    {
                        "type": "res",
                        "id": rid,
                        "ok": False,
                        "error": {
                            "code": "INVALID_REQUEST",
                            "message": f"unknown method: {method}",
                            "details": {"code": "UNKNOWN_METHOD"},
                        },
                    }
                )
            )

    def chat_send(self, conn: Conn, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        raw_key = str(params.get("sessionKey", "main"))
        key = raw_key if raw_key.startswith("agent:") else f"agent:main:{raw_key}"
        run_id = str(params.get("idempotencyKey", ""))
        message = str(params.get("message", ""))
        session = self.sessions.get((conn.user, key))
        if session is None:
            session = self.sessions[(conn.user, key)] = Session(key)
        base = {"runId": run_id, "sessionKey": key, "sessionId": session.session_id}
        known = session.runs.get(run_id)
        if known is not None:
            if known.message != message:
                return {}, {
                    "code": "CONFLICT",
                    "message": "idempotencyKey was already used with a different message",
                    "details": {"field": "idempotencyKey", "reason": "idempotency-conflict"},
                }
            if known.done:
                return {**base, "status": "ok", "reply": known.reply, "stopReason": "stop"}, None
            return {**base, "status": "in_flight"}, None
        record = session.runs[run_id] = RunRecord(message)
        task = asyncio.get_running_loop().create_task(self.run(conn.user, session, run_id, record))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return {**base, "status": "started"}, None

    async def broadcast(self, user: str, name: str, payload: dict[str, Any], *, subscribed_only: bool = False) -> None:
        for conn in list(self.users.get(user, ())):
            if not subscribed_only or conn.subscribed:
                await conn.event(name, payload)

    async def changed(self, user: str, session: Session, reason: str, run_id: str, running: bool) -> None:
        session.version += 1
        row = {
            "key": session.key,
            "sessionId": session.session_id,
            "agentId": "main",
            "status": "running" if running else "done",
            "hasActiveRun": running,
            "lastRunId": run_id,
            "version": session.version,
            "updatedAt": now_ms(),
        }
        await self.broadcast(
            user,
            "sessions.changed",
            {"sessionKey": session.key, "reason": reason, "ts": now_ms(), "runId": run_id, "session": row},
            subscribed_only=True,
        )

    async def run(self, user: str, session: Session, run_id: str, record: RunRecord) -> None:
        tick_ms, words = 20, None
        for name, arg in DIRECTIVE_RE.findall(record.message):
            if name == "tick" and arg.isdigit():
                tick_ms = int(arg)
            elif name == "words" and arg.isdigit():
                words = int(arg)
        text = " ".join(DIRECTIVE_RE.sub(" ", record.message).split())
        body = [f"word{i + 1}" for i in range(words)] if words is not None else text.split()
        chunks = ["echo:"] + [f" {w}" for w in body]
        base = {"runId": run_id, "sessionKey": session.key, "sessionId": session.session_id}
        await self.changed(user, session, "run.started", run_id, True)
        seq, acc, sent, last = 0, "", "", 0.0
        for i, chunk in enumerate(chunks):
            if i:
                await asyncio.sleep(tick_ms / 1000)
            acc += chunk
            now = time.monotonic()
            if now - last >= DELTA_INTERVAL:
                seq += 1
                await self.broadcast(
                    user,
                    "chat",
                    {
                        **base,
                        "seq": seq,
                        "state": "delta",
                        "deltaText": acc[len(sent) :],
                        "message": {
                            "role": "assistant",
                            "content": [{"type": "text", "text": acc}],
                            "timestamp": now_ms(),
                        },
                    },
                )
                sent, last = acc, now
        if acc != sent:
            seq += 1
            await self.broadcast(
                user,
                "chat",
                {
                    **base,
                    "seq": seq,
                    "state": "delta",
                    "deltaText": acc[len(sent) :],
                    "message": {"role": "assistant", "content": [{"type": "text", "text": acc}], "timestamp": now_ms()},
                },
            )
        record.reply, record.done = acc, True
        seq += 1
        await self.broadcast(
            user,
            "chat",
            {
                **base,
                "seq": seq,
                "state": "final",
                "stopReason": "stop",
                "message": {"role": "assistant", "content": [{"type": "text", "text": acc}], "timestamp": now_ms()},
            },
        )
        await self.changed(user, session, "run.completed", run_id, False)


async def main(host: str, port: int, http_port: int = 0) -> None:
    floor = Floor()
    async with serve(floor.handler, host, port, max_size=2**20, ping_interval=None, compression=None):
        print(f"floor listening on ws://{host}:{port}/", flush=True)
        if http_port:  # the HTTP floor (bench/floor_http.py) beside it, in this process
            http = await asyncio.start_server(floor_http.handle, host, http_port)
            print(f"HTTP floor listening on http://{host}:{http_port}/v1", flush=True)
            async with http:
                await asyncio.Future()
        await asyncio.Future()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--http-port", type=int, default=0, help="also serve the HTTP floor on this port")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.host, args.port, args.http_port))
