"""The request methods, a room per method family; each family's module holds its params, its
handlers and its answers, and both doors (the WebSocket consumer, the HTTP API) call them.

- `registry`: the methods with their scopes, looked up, checked and timed;
- `send`: `chat.send`, `sessions.steer`, `chat.abort` and admission (one path for every door);
- `commands`: inline commands, `commands.list`, `chat.metadata`;
- `sessions`: `sessions.*` (list, create, patch, reset, delete; describe, resolve, messages);
- `history`: `chat.history`, `sessions.get`, `chat.startup`;
- `approvals`: `plugin.approval.*`;
- `agent`: the `agent` method and `agent.wait`;
- `agents`: `agents.list`, `models.list`, `agent.identity.get`, `models.authStatus`;
- `gateway`: `health`, `status`;
- `openclaw`: what OpenClaw's clients call that this gateway has nothing for;
- `session_settings`: levels and models a session may choose, shared by several families.

Importing the package registers every method.
"""

from chat.methods import agent, agents, approvals, branches, commands, gateway, history, openclaw, usage  # noqa: F401
from chat.methods.send import handlers as send_handlers  # noqa: F401
from chat.methods.sessions import handlers as sessions_handlers  # noqa: F401
from chat.methods.sessions import lookup  # noqa: F401
