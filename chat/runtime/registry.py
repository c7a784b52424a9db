"""The connections of this process, for the repair pass, the drain and the gauges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class ConnectionRegistry:
    """Authenticated connections of this process (added after `hello-ok`, removed on disconnect)."""

    def __init__(self) -> None:
        self._connections: set[Any] = set()
        self._by_user: dict[int, set[Any]] = {}

    def add(self, connection: Any) -> None:
        self._connections.add(connection)
        self._by_user.setdefault(_user_of(connection), set()).add(connection)

    def discard(self, connection: Any) -> None:
        self._connections.discard(connection)
        user = _user_of(connection)
        mine = self._by_user.get(user)
        if mine is not None:
            mine.discard(connection)
            if not mine:
                del self._by_user[user]

    def clear(self) -> None:
        self._connections.clear()
        self._by_user.clear()

    def of_user(self, user_id: int) -> set[Any]:
        """The connections of one user (the per-user cap counts them)."""
        return self._by_user.get(user_id, set())

    def snapshot(self) -> list[Any]:
        """A copy to iterate while connections come and go."""
        return list(self._connections)

    def __len__(self) -> int:
        return len(self._connections)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.snapshot())


connections = ConnectionRegistry()


def _user_of(connection: Any) -> int:
    state = getattr(connection, "state", None)
    return int(getattr(state, "user_id", 0) or 0)
