"""A protocol v4 client, whatever carries its frames (test communicator or a real socket)."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

_ids = itertools.count(1)
TERMINAL = ("final", "error", "aborted")


class ProtocolClient:
    """Requests, responses and events over one connection; subclasses move the text."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []  # everything received, in order
        self.responses: dict[str, dict[str, Any]] = {}
        self.closed: int | None = None
        self.hello: dict[str, Any] | None = None

    async def _receive(self, timeout: float) -> str | None:
        """One text frame, or None once closed (setting `closed`); TimeoutError when quiet."""
        raise NotImplementedError

    async def send_raw(self, text: str) -> None:
        raise NotImplementedError

    @property
    def close_code(self) -> int | None:
        return self.closed

    async def _pump_one(self, timeout: float) -> dict[str, Any] | None:
        text = await self._receive(timeout)
        if text is None:
            return None
        frame: dict[str, Any] = json.loads(text)
        self.frames.append(frame)
        if frame["type"] == "event":
            self.events.append(frame)
        elif frame["type"] == "res":
            self.responses[frame["id"]] = frame
        return frame

    async def send(self, method: str, params: dict[str, Any] | None = None, rid: str | None = None) -> str:
        rid = rid or f"r{next(_ids)}"
        frame: dict[str, Any] = {"type": "req", "id": rid, "method": method}
        if params is not None:
            frame["params"] = params
        await self.send_raw(json.dumps(frame))
        return rid

    async def response(self, rid: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while rid not in self.responses:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed is not None:
                raise AssertionError(f"no response to {rid}; closed={self.closed}")
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                continue
        return self.responses.pop(rid)

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        return await self.response(await self.send(method, params), timeout)

    async def ok(self, method: str, params: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        res = await self.call(method, params, timeout)
        assert res["ok"], res
        payload: dict[str, Any] = res["payload"]
        return payload

    async def wait_event(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = 5.0, *, start: int = 0
    ) -> dict[str, Any]:
        """The first event (seen so far or arriving within `timeout`) matching `pred`."""
        deadline = time.monotonic() + timeout
        idx = start
        while True:
            while idx < len(self.events):
                if pred(self.events[idx]):
                    return self.events[idx]
                idx += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed is not None:
                raise AssertionError(f"event not seen; closed={self.closed}; events={self.events[-5:]}")
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                continue

    async def wait_terminal(self, run_id: str, timeout: float = 5.0) -> dict[str, Any]:
        ev = await self.wait_event(
            lambda e: e["event"] == "chat" and e["payload"]["runId"] == run_id and e["payload"]["state"] in TERMINAL,
            timeout,
        )
        payload: dict[str, Any] = ev["payload"]
        return payload

    async def drain(self, seconds: float) -> None:
        """Collect whatever arrives for `seconds`."""
        deadline = time.monotonic() + seconds
        while self.closed is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                return

    async def wait_closed(self, timeout: float = 10.0) -> int:
        await self.drain(timeout)
        if self.closed is None:
            raise AssertionError("socket not closed")
        return self.closed

    def answers(self, rid: str) -> list[dict[str, Any]]:
        """Every response to request `rid`, in order (`agent` answers twice)."""
        return [f for f in self.frames if f["type"] == "res" and f["id"] == rid]

    async def wait_answers(self, rid: str, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The first `count` responses to `rid`, waiting for them."""
        deadline = time.monotonic() + timeout
        while len(self.answers(rid)) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed is not None:
                raise AssertionError(f"{len(self.answers(rid))} of {count} answers to {rid}; closed={self.closed}")
            try:
                await self._pump_one(remaining)
            except TimeoutError:
                continue
        return self.answers(rid)[:count]

    def agent_events(self, run_id: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["event"] == "agent" and e["payload"]["runId"] == run_id]

    def chat_events(self, run_id: str) -> list[dict[str, Any]]:
        return [e["payload"] for e in self.events if e["event"] == "chat" and e["payload"]["runId"] == run_id]
