"""The in-memory channel layer (one process), without its per-receive sweep of every channel.

Channels' `InMemoryChannelLayer` walks every channel and group on each `receive` to drop
expired messages: with hundreds of connections, each delivered event paid for all of
them. Here that sweep runs at most once a second: a message past its expiry (60 s by
default) may live up to a second longer before it is dropped.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer as ChannelsInMemoryChannelLayer


class InMemoryChannelLayer(ChannelsInMemoryChannelLayer):
    """`channels.layers.InMemoryChannelLayer` with its expiry sweep throttled."""

    sweep_interval = 1.0
    _swept_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._swept_at >= self.sweep_interval:
            self._swept_at = now
            super()._clean_expired()  # type: ignore[misc]  # not in the stubs
