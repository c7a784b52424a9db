"""The lifecycle services: the only code that changes run and session state.

One subject a module, around the one `core.transition`:

- `runs`: admission of a send and each step of a run up to its terminal state;
- `sessions`: create, rename, abort, stop, reset, delete;
- `operators`: operator actions and repairs;
- `idle`: what an idle session is, and deleting idle sessions;
- `toolcalls`: tool calls and approvals.

Every service is synchronous and runs its whole unit (lock, check, write, signal) in
one `transaction.atomic()` block; async callers go through a database thread. Each
change sends a signal (`sessions_app.signals`); receivers write the audit row in the
transaction and register broadcasts with `transaction.on_commit`.
"""

from sessions_app.lifecycle.core import LifecycleError, SessionNotFound

__all__ = ["LifecycleError", "SessionNotFound"]
