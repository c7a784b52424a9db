"""The one place channel-layer group names are built ([A-Za-z0-9._-], < 100 chars)."""

from __future__ import annotations

import re

OPERATORS = "operators"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def user_group(owner_id: int) -> str:
    """Every connection of one owner (all tabs and devices)."""
    return f"user.{int(owner_id)}"


def process_group(server_id: str) -> str:
    """The run manager of one server process (abort routing)."""
    return f"proc.{_SAFE.sub('-', server_id)[:80]}"
