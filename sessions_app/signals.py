"""Lifecycle signals. Only `sessions_app.lifecycle` sends them, always inside its transaction.

Receivers run inside that transaction, so they see the rows as just written; anything
that leaves the process (broadcasts, waking a run's worker) belongs in an on-commit callback.
"""

from django.dispatch import Signal

# kwargs: run (Run, as written, its stream_seq at the transition's chat event), session
#         (ChatSession, locked), from_state ('' for a new run), to_state, reason, actor,
#         row_changed (bool: the session row changed with it)
run_transitioned = Signal()

# kwargs: session (ChatSession, locked), reason, actor, deleted (bool: about to be deleted)
session_changed = Signal()

# kwargs: tokens (list of (user_id, token_hash)) — API tokens just revoked; sent inside the
#         revoking transaction, so receivers act on commit
tokens_revoked = Signal()

# kwargs: call (ToolCall, as written), run, session (locked), from_state ('' for a new call or an
#         approval's own change), to_state (the call's state), reason, actor, event (the wire event it
#         carries: 'start', 'result', 'approval', 'approval.resolved', or '' for none), seq (that
#         event's seq in the run), approval (ToolApproval or None)
tool_changed = Signal()

# kwargs: session (ChatSession, locked), receipt (CommandReceipt, as written) — an inline command
#         and its first answer, just stored in the session's transcript (/status, /think, /verbose,
#         /model; a replay stores nothing and sends nothing)
command_stored = Signal()

# kwargs: agent_id (str), calls (list of `lifecycle.usage.CallUsage`) — model calls whose usage was
#         just recorded (each once: a step recorded before is not sent again)
usage_recorded = Signal()
