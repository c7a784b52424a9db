"""Operator admin: sessions (stuck / failed filters, timeline, actions), runs, tool calls, API tokens, processes.

Nothing here writes run or session state itself. Every action calls the lifecycle
service once per row (never `QuerySet.update()` or a bulk delete), so each change
writes its audit row and reaches connected clients like a change made over the
WebSocket. Querysets annotate the few related values a page shows instead of
joining whole rows, so list and detail pages run a fixed number of queries
whatever the size of the tables.

One module per model; importing them registers their admins (Django imports this package).
"""

from sessions_app.admin import processes, runs, sessions, tokens, tools  # noqa: F401
