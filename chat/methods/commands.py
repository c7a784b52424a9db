"""Inline commands (§4; docs/protocol-notes.md): /stop, /new, /reset, /status, /think, /verbose,
/model — answered by the gateway, never sent to a model; `commands.list` and `chat.metadata`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chat.base import agents as catalog
from chat.methods import agents, session_settings
from chat.methods.registry import Conn, Reply, call, method
from chat.methods.send.acks import AckStatus, ack_payload
from chat.methods.session_settings import DEFAULT_SETTING, setting_value
from chat.protocol import run_events
from chat.protocol.scopes import Scope
from chat.protocol.session_rows import session_rows
from sessions_app.gateway_reads import queues_of
from sessions_app.lifecycle import sessions
from sessions_app.models import (
    ChatSession,
    CommandReceipt,
)


@dataclass(frozen=True)
class InlineCommandSpec:
    """One inline command: what it does, the session setting it reads or sets, how `commands.list` lists it."""

    name: str  # as typed, "/think"
    effect: sessions.CommandEffect  # stop, reset, or answer
    description: str
    category: str
    setting: str | None = None  # thinkingLevel, verboseLevel or model: takes one optional argument
    arg: tuple[str, str] = ("", "")  # that argument's name and description, as `commands.list` lists it


# THE inline commands (the page takes them from `commands.list`), in the order clients list them.
COMMANDS = {
    spec.name: spec
    for spec in (
        InlineCommandSpec("/status", "answer", "Show the session's status, model, settings and token counts", "status"),
        InlineCommandSpec(
            "/think",
            "answer",
            "Show or set the thinking level",
            "options",
            "thinkingLevel",
            ("level", "thinking level"),
        ),
        InlineCommandSpec(
            "/verbose", "answer", "Show or set the verbose level", "options", "verboseLevel", ("level", "verbose level")
        ),
        InlineCommandSpec(
            "/model",
            "answer",
            "Show or set the session's model",
            "options",
            "model",
            ("model", "one of the agent's models"),
        ),
        InlineCommandSpec("/new", "reset", "Start the session over (a new sessionId)", "session"),
        InlineCommandSpec("/reset", "reset", "Start the session over (a new sessionId)", "session"),
        InlineCommandSpec("/stop", "stop", "Stop the session's active and queued runs", "session"),
    )
}
STOP_COMMANDS = {name for name, spec in COMMANDS.items() if spec.effect == "stop"}
RESET_COMMANDS = {name for name, spec in COMMANDS.items() if spec.effect == "reset"}
STATUS_COMMAND = "/status"
# Inline commands that take one optional argument, and the session setting each reads or sets.
SETTING_COMMANDS = {name: spec.setting for name, spec in COMMANDS.items() if spec.setting is not None}
# OpenClaw's ACP bridge (`openclaw acp`) puts this line and a blank line before every prompt, so an
# editor's `/status` arrives as "[Working directory: /x]\n\n/status": a command after exactly this
# header is still a command (docs/protocol-notes.md, "Session settings and inline commands").
ACP_CWD_HEADER_RE = re.compile(r"\[Working directory: [^\n]*\]\n\n")


class CommandSend(Protocol):
    """A send that is an inline command (`send.params.ChatSendParams`), as the command reads it."""

    key: str
    agent_id: str
    run_id: str
    command: str | None
    command_arg: str | None
    command_text: str


def command_line(message: str) -> str:
    """The text a command is read from: the message without the ACP bridge's leading
    `[Working directory: …]` line and blank line when it starts with exactly that (nothing else
    is stripped)."""
    header = ACP_CWD_HEADER_RE.match(message)
    return message[header.end() :] if header else message


def parse_command(message: str, agent_id: str) -> tuple[str, str | None] | None:
    """The inline command a message is, with its validated argument; None for a message to the model.

    /stop, /new, /reset and /status are commands only as the whole message. /think, /verbose and
    /model are commands with at most one argument: a wrong one is INVALID_REQUEST with
    `details.field: "message"`, so a mistyped setting never reaches the model; followed by more
    than one word ("/think about this bug") the message is a sentence, for the model.
    """
    words = message.split()
    if not words:
        return None
    name, args = words[0], words[1:]
    if name in STOP_COMMANDS | RESET_COMMANDS | {STATUS_COMMAND}:
        return (name, None) if not args else None
    if name not in SETTING_COMMANDS:
        return None
    setting = SETTING_COMMANDS[name]
    if len(args) > 1:
        return None
    if not args:
        return name, None
    if args[0].lower() == DEFAULT_SETTING:
        return name, ""
    value = setting_value(setting, args[0], agent_id, field="message")
    return name, value


async def command(conn: Conn, send: CommandSend, *, announce: bool = False) -> Reply:
    """Inline commands (§4; docs/protocol-notes.md): answered by the gateway, never sent to a model.

    No run is created and none is tracked: the ack is terminal (`ok`) and carries the answer as
    `reply`. Its first answer is kept under the send's key: a retry gets it again and changes
    nothing (§4). /status, /think, /verbose and /model also store the command and its answer in
    the transcript, marked `command`, which the owner's connections are told of as a `chat`
    `final` of the send's runId (`receivers.on_command_stored`). With `announce` (chat.send,
    sessions.steer) this connection gets that `final` (for any command) before the ack: OpenClaw's
    ACP bridge shows only text from `chat` events and ignores `reply`.
    """
    name = send.command
    assert name is not None
    answered: sessions.CommandAnswer = await call(
        sessions.answer_command,
        owner_id=conn.state.user_id,
        key=send.key,
        agent_id=send.agent_id,
        command=_inline_command(send),
        answer=command_answer(name, send.command_arg),
    )
    session, receipt = answered.session, answered.receipt
    if not answered.replayed:
        # Closed for this connection as a terminal ack closes a run: the broadcast of the stored
        # exchange reaches this socket only after this answer (the consumer holds events while it
        # handles a frame), and is dropped then. A replay is its ack alone, as a terminal run's
        # resend is (its `reply` is the answer).
        conn.state.track_run(
            run_events.command_event_key(receipt.pk),
            terminal=True,
            run_id=receipt.key,
            session_key=session.key,
            session_id=str(receipt.session_generation),
        )
        if announce:
            # before the ack: the consumer sends what a handler sends, then its answer, in order
            await conn.send_events([("chat", run_events.command_final(session.key, receipt))])
    return Reply(command_ack(session.key, receipt, name))


def _inline_command(send: CommandSend) -> sessions.InlineCommand:
    """What a parsed command does, as the lifecycle carries it out."""
    name, arg = send.command, send.command_arg
    assert name is not None
    spec = COMMANDS[name]
    setting = spec.setting
    change = None
    if setting is not None and arg is not None:
        change = sessions.SettingsChange(
            thinking_level=arg if setting == "thinkingLevel" else None,
            verbose_level=arg if setting == "verboseLevel" else None,
            model=arg if setting == "model" else None,
        )
    return sessions.InlineCommand(send.run_id, send.command_text, spec.effect, change)


def command_answer(command: str, arg: str | None) -> Callable[[ChatSession, list[str]], str]:
    """The answer of an inline command, made from the row as the command left it and the runs it stopped."""

    def answer(session: ChatSession, killed: list[str]) -> str:
        if command in STOP_COMMANDS or command in RESET_COMMANDS:
            return _stop_answer(command, str(session.session_id), killed)
        row = session_rows([session], queues_of([session]))[0]
        if command == STATUS_COMMAND:
            return status_text(row)
        setting = SETTING_COMMANDS[command]
        if setting == "model":
            if arg is None:
                agent = catalog.of(session.agent_id)
                listed = ", ".join(f"{m} (default)" if m == agent.model else m for m in agent.models)
                return f"Current model: {_model_ref(row)}.\nModels of agent {session.agent_id}: {listed or 'none'}."
            if arg == "":
                return f"Model reset to default: {_model_ref(row)}."
            return f"Model set to {_model_ref(row)}."
        title = "Thinking level" if setting == "thinkingLevel" else "Verbose level"
        if arg is None:
            choices = ", ".join(session_settings.setting_choices(setting, session.agent_id))
            return f"Current {title.lower()}: {_setting_text(row[setting])}.\nOptions: {choices}."
        if arg == "":
            return f"{title} reset to default."
        return f"{title} set to {arg}."

    return answer


def _model_ref(row: dict[str, Any]) -> str:
    return f"{row['modelProvider']}/{row['model']}" if row["model"] else "none"


def _setting_text(value: str | None) -> str:
    return value if value else "default"


def status_text(row: dict[str, Any]) -> str:
    """/status: the session, its agent and model, its settings, its runs and its token counts."""
    if row["hasActiveRun"]:
        run = f"running {row['activeRunIds'][0]}"
    elif row["status"] is None:
        run = "idle, no run yet"
    else:
        run = f"idle, last run {row['status']} ({row['lastRunId']})"
    if row["queuedRunIds"]:
        run += f", {len(row['queuedRunIds'])} queued"
    if row["totalTokens"] is not None:
        tokens = f"{row['inputTokens']} in, {row['outputTokens']} out, {row['totalTokens']} total"
    else:
        tokens = "not reported"
    if row["contextTokens"] is not None:
        tokens += f" (context budget {row['contextTokens']})"
    return "\n".join(
        [
            f"Session {row['key']} (sessionId {row['sessionId']})",
            f"Agent {row['agentId']}, model {_model_ref(row)}",
            f"Thinking {_setting_text(row['thinkingLevel'])}, verbose {_setting_text(row['verboseLevel'])}",
            f"Run: {run}",
            f"Tokens (last run): {tokens}",
        ]
    )


def _stop_answer(command: str, session_id: str, killed: Sequence[str]) -> str:
    """The answer of /stop, /new and /reset."""
    stopped = f"Stopped {len(killed)} run{'s' if len(killed) != 1 else ''}: {', '.join(killed)}." if killed else ""
    if command in STOP_COMMANDS:
        return stopped or "Nothing to stop."
    return " ".join(filter(None, [f"New conversation started (sessionId {session_id}).", stopped]))


def command_ack(session_key: str, receipt: CommandReceipt, command: str) -> dict[str, Any]:
    """The `ok` ack of an inline command (§4): terminal, no run behind it; `reply` is its answer.
    A retry's is the first one's, from the receipt (its sessionId, its stopped runs)."""
    return ack_payload(
        None,
        AckStatus.OK,
        session_key,
        str(receipt.session_generation),
        runId=receipt.key,
        aborted=bool(receipt.run_ids),
        runIds=list(receipt.run_ids),
        command=command,
        reply=receipt.reply,
    )


def _listed(spec: InlineCommandSpec, agent_id: str) -> dict[str, Any]:
    """One command as OpenClaw's `commands.list` lists it (a setting command with its choices)."""
    name = spec.name[1:]
    entry: dict[str, Any] = {
        "name": name,
        "textAliases": [spec.name],
        "description": spec.description,
        "category": spec.category,
        "source": "native",
        "scope": "text",
        "acceptsArgs": spec.setting is not None,
    }
    if spec.setting is not None:
        arg_name, arg_description = spec.arg
        choices = session_settings.setting_choices(spec.setting, agent_id)
        entry["args"] = [
            {
                "name": arg_name,
                "description": arg_description,
                "type": "string",
                "required": False,
                **({"choices": [{"value": c, "label": c} for c in choices]} if choices else {}),
            }
        ]
    return entry


def commands(agent_id: str) -> list[dict[str, Any]]:
    """The inline commands `chat.send` answers in the gateway (`commands.list`, `chat.metadata`)."""
    return [_listed(spec, agent_id) for spec in COMMANDS.values()]


@method("chat.metadata", scope=Scope.READ)
async def chat_metadata(conn: Conn, params: dict[str, Any]) -> Reply:
    """What a chat of this agent offers: its inline commands and its defaults (models: `models.list`)."""
    agent_id = agents.parse_identity(params)
    return Reply(
        {
            "agentId": agent_id,
            "commands": commands(agent_id),
            "defaults": session_settings.session_defaults(agent_id),
        }
    )


@method("commands.list", scope=Scope.READ)
async def commands_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The gateway's inline commands (`chat.send` answers them without a run)."""
    return Reply({"commands": commands(agents.parse_identity(params))})
