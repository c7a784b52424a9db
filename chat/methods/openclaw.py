"""What OpenClaw's own clients call that this gateway has nothing for: honest answers (an empty
result, or UNAVAILABLE naming the feature).
"""

from __future__ import annotations

from typing import Any

from chat.methods.registry import Conn, Handler, Reply, method
from chat.protocol.errors import ProtocolError
from chat.protocol.scopes import Scope


def config_snapshot() -> dict[str, Any]:
    """`config.get`: OpenClaw's config file snapshot, empty. This gateway is configured by its
    environment, which no client reads or edits; `readOnly` says so."""
    return {
        "path": None,
        "exists": False,
        "valid": True,
        "readOnly": True,
        "raw": None,
        "hash": None,
        "config": {},
        "runtimeConfig": {},
        "issues": [],
        "warnings": [],
    }


@method("question.list", scope=Scope.READ)
async def question_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """Agents here never ask the operator questions: always none."""
    return Reply({"questions": []})


@method("config.get", scope=Scope.READ)
async def config_get(conn: Conn, params: dict[str, Any]) -> Reply:
    """No configuration is read or edited over the protocol here: an empty, read-only snapshot."""
    return Reply(config_snapshot())


# Reads of OpenClaw features with nothing to show here, answered with OpenClaw's empty result.
NOTHING: dict[str, dict[str, Any]] = {
    "tasks.list": {"tasks": []},  # background tasks: none run here
    "progressCard.get": {"card": None},  # no progress cards
}


# Methods of OpenClaw features this gateway does not have: UNAVAILABLE, saying which feature. They
# are left out of hello-ok's `features.methods`: listing them would claim the feature (OpenClaw's
# clients check that list before some calls, e.g. the Control UI's command palette).
ABSENT: dict[str, str] = {
    "cron.list": "scheduled automations (cron)",
    "cron.status": "scheduled automations (cron)",
    "cron.runs": "scheduled automations (cron)",
    "environments.list": "environments",
    "node.list": "paired nodes",
    "device.pair.list": "device pairing",
    "plugins.list": "plugins",
    "channels.status": "messaging channels",
    "talk.catalog": "voice (talk)",
    "sessions.companion.state": "session companions",
    "sessions.observer.visibility": "observer presence",
    "exec.approval.list": "exec approvals (tool approvals are plugin.approval.*)",
    "openclaw.approval.list": "operator approvals (tool approvals are plugin.approval.*)",
    "config.schema": "config editing",
}


# ... and the changes among them, which need write (OpenClaw: admin) like any change
ABSENT_CHANGES: dict[str, str] = {
    "config.set": "config editing",
    "config.patch": "config editing",
    "config.apply": "config editing",
    "cron.add": "scheduled automations (cron)",
}


def _nothing(result: dict[str, Any]) -> Handler:
    async def answer(conn: Conn, params: dict[str, Any]) -> Reply:
        return Reply(dict(result))

    return answer


def _absent(name: str, feature: str) -> Handler:
    async def answer(conn: Conn, params: dict[str, Any]) -> Reply:
        raise ProtocolError(
            "UNAVAILABLE",
            f"{name} is not available: this gateway has no {feature}",
            retryable=False,
            reason="not-supported",
            method=name,
        )

    return answer


for _name, _result in NOTHING.items():
    method(_name, scope=Scope.READ)(_nothing(_result))
for _name, _feature in ABSENT.items():
    method(_name, scope=Scope.READ, listed=False)(_absent(_name, _feature))
for _name, _feature in ABSENT_CHANGES.items():
    method(_name, scope=Scope.WRITE, listed=False)(_absent(_name, _feature))
