"""Lifecycle signals. Only `sessions_app.lifecycle` sends them, always inside its transaction."""

from django.dispatch import Signal

# kwargs: run (Run), session (ChatSession), from_state, to_state, reason, actor,
#         row_changed (bool), chat_payload (dict | None: the chat event to broadcast)
run_transitioned = Signal()

# kwargs: session (ChatSession), reason, actor, deleted_row (dict | None), owner_id
session_changed = Signal()
