"""The in-memory channel layer (one process), with two fixes to Channels' own.

- Channels' `InMemoryChannelLayer` walks every channel and group on each `receive` to
  drop expired messages: with hundreds of connections, each delivered event paid for all
  of them. Here that sweep runs at most once a second: a message past its expiry (60 s
  by default) may live up to a second longer before it is dropped.
- It keeps `channel_capacity` as given instead of compiling its patterns, so any
  per-channel capacity fails at the first receive; here they are compiled, as the base
  class (and channels-redis) intend.
"""

from __future__ import annotations

import time
from typing import Any

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    """`channels.layers.InMemoryChannelLayer` with its expiry sweep throttled."""

    sweep_interval = 1.0
    _swept_at = 0.0

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.channel_capacity = self.compile_capacities(self.channel_capacity)  # type: ignore[arg-type,assignment]

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= self.sweep_interval:
            self._swept_at = now
            super()._clean_expired()  # type: ignore[misc]  # not in the stubs
