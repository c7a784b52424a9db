"""The connections of this process, for the repair pass, the drain and the gauges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class ConnectionRegistry:
    """Authenticated connections of this process (added after `hello-ok`, removed on disconnect)."""

    def __init__(self) -> None:
        self._connections: set[Any] = set()

    def add(self, connection: Any) -> None:
        self._connections.add(connection)

    def discard(self, connection: Any) -> None:
        self._connections.discard(connection)

    def clear(self) -> None:
        self._connections.clear()

    def snapshot(self) -> list[Any]:
        """A copy to iterate while connections come and go."""
        return list(self._connections)

    def __len__(self) -> int:
        return len(self._connections)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.snapshot())


connections = ConnectionRegistry()
