"""Operator admin: sessions (stuck / failed filters, timeline, actions), runs, tool calls, API tokens, processes.

Nothing here writes run or session state itself. Every action calls the lifecycle
service once per row (`common.act_on_each`; never `QuerySet.update()` or a bulk delete), so each change
writes its audit row and reaches connected clients like a change made over the
WebSocket. Querysets annotate the few related values a page shows instead of
joining whole rows, so list and detail pages run a fixed number of queries
whatever the size of the tables.

One module per model, the sessions' filters and actions beside theirs (`session_filters`,
`session_actions`); importing them registers their admins (Django imports this package).
"""

from sessions_app.admin import files, processes, runs, sessions, tokens, toolcalls, usage  # noqa: F401
