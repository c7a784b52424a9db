"""Sessions, runs, transcript messages, lifecycle audit, API tokens, server processes.

Only `sessions_app.lifecycle` writes run and session state; these classes hold data.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models


class RunState(models.TextChoices):
    QUEUED = "queued"  # admitted behind the session's active run
    DISPATCHING = "dispatching"  # active: admitted, the backend is being set up
    RUNNING = "running"  # active: the backend is producing output
    DONE = "done"  # completed
    FAILED = "failed"  # dispatch or backend failure, or interrupted by a dead process
    KILLED = "killed"  # aborted (rpc, /stop, interrupt, steer, reset, delete, operator)
    TIMEOUT = "timeout"  # run budget or backend timeout


ACTIVE_STATES = (RunState.DISPATCHING, RunState.RUNNING)
TERMINAL_STATES = (RunState.DONE, RunState.FAILED, RunState.KILLED, RunState.TIMEOUT)
OPEN_STATES = (RunState.QUEUED, *ACTIVE_STATES)


# The queue modes of a steer (`lifecycle.steering`): waiting for the session's active run to take it, or a
# follow-up because that run ended first (docs/protocol-notes.md, "Steering").
STEER = "steer"
STEER_FOLLOWUP = "steer-followup"


class RunErrorKind(models.TextChoices):
    """Why a run ended `failed` or `timeout` (its `errorKind`, PROTOCOL.md §5; docs/agents.md, "Errors")."""

    DISPATCH = "dispatch"  # setup failed before the backend started (no backend, rejected request)
    BACKEND = "backend"  # the backend failed after it started
    TIMEOUT = "timeout"  # the run's budget, or a backend timeout
    INTERRUPTED = "interrupted"  # its process died or stopped (recovery, §8)
    RATE_LIMIT = "rate_limit"  # the model server said 429
    CONTEXT_LENGTH = "context_length"  # the conversation is too long for the model
    UNAVAILABLE = "unavailable"  # the database stayed out of reach (GATEWAY_RUN_DB_WAIT_SECONDS)
    UNKNOWN = "unknown"  # an internal error, or an operator's mark-failed / repair


class SessionStatus(models.TextChoices):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    KILLED = "killed"
    TIMEOUT = "timeout"


class SessionKind(models.TextChoices):
    """Where a session came from: opened by a client (`direct`), or made for one stateless HTTP request (`api`,
    HTTP-API.md §14.3; left out of the page's list and of `sessions.list` unless asked for)."""

    DIRECT = "direct"
    API = "api"


class RunSurface(models.TextChoices):
    """The door a run came in by (the `surface` label of its metrics, HTTP-API.md §14.7)."""

    WEBSOCKET = "ws"
    HTTP = "http"


class Actor(models.TextChoices):
    USER = "user"
    SYSTEM = "system"
    OPERATOR = "operator"
    REAPER = "reaper"


def message_pointer() -> models.ForeignKey[Any, Any]:
    """A pointer at a transcript message (a branch's leaf, a run's prompt): no constraint and no index,
    as messages go with their session, never alone (nothing to cascade) and are found from the pointer."""
    return models.ForeignKey(
        "Message",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )


class ChatSession(models.Model):
    """One conversation of one owner, addressed by its canonical key."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_sessions")
    key = models.CharField(max_length=220)
    agent_id = models.CharField(max_length=64, default="main")
    session_id = models.UUIDField(default=uuid.uuid4)
    label = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(
        max_length=8, choices=SessionKind.choices, default=SessionKind.DIRECT, db_default=SessionKind.DIRECT
    )
    # NULL is meaningful: the protocol's `status: null` means "never ran".
    status = models.CharField(max_length=16, choices=SessionStatus.choices, null=True, blank=True)  # noqa: DJ001
    active_run = models.OneToOneField("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    last_run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    aborted_last_run = models.BooleanField(default=False)
    last_run_error = models.TextField(blank=True, default="")
    # "approval" while an approval of the active run is pending (TOOLS.md §13.2 `waitingFor`), else ""
    waiting_for = models.CharField(max_length=16, blank=True, default="", db_default="")
    # The session's settings (docs/protocol-notes.md, "Session settings"); "" = not set, the agent's default.
    thinking_level = models.CharField(max_length=16, blank=True, default="", db_default="")
    verbose_level = models.CharField(max_length=16, blank=True, default="", db_default="")
    model_override = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Token usage of the last finished run of the current transcript, as that run stored it
    # (NULL: it reported none, or no run has finished since the last reset).
    input_tokens = models.IntegerField(null=True, blank=True)
    output_tokens = models.IntegerField(null=True, blank=True)
    # The newest message of the active branch of the current transcript (NULL: it is empty, or
    # rewound to its start): THE active branch is this message and its parents (`sessions_app.branches`).
    # Messages go with their session, never alone: nothing to cascade here.
    active_leaf = message_pointer()
    # every model call's usage in this session, all generations (`lifecycle.usage`)
    total_input_tokens = models.BigIntegerField(default=0, db_default=0)
    total_output_tokens = models.BigIntegerField(default=0, db_default=0)
    total_cost_micros = models.BigIntegerField(default=0, db_default=0)
    version = models.BigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="uniq_session_owner_key")]
        indexes = [
            # the admin's default order (-updated_at, -id, deep pages included) and retention's age test
            models.Index(fields=["updated_at", "id"], name="session_updated_id"),
            models.Index(fields=["owner", "-updated_at"], name="session_owner_updated"),
            # sessions.list of one agent (OpenClaw's clients list by agentId)
            models.Index(fields=["owner", "agent_id", "-updated_at"], name="session_owner_agent_updated"),
            # sessions.list and the page leave `api` sessions out unless asked (HTTP-API.md §14.3)
            models.Index(fields=["owner", "kind", "-updated_at"], name="session_owner_kind_updated"),
            models.Index(fields=["status", "updated_at"], name="session_status_updated"),
            # operators' "failed in the last 24 h" filter and count
            models.Index(fields=["status", "ended_at"], name="session_status_ended"),
        ]

    def __str__(self) -> str:
        return self.key


class Run(models.Model):
    """One agent run, keyed by the client's idempotency key within its session."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="runs")
    run_id = models.CharField(max_length=128)
    session_generation = models.UUIDField()
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.QUEUED)
    queue_mode = models.CharField(max_length=16, default="followup")
    queue_seq = models.BigIntegerField(default=0)
    message = models.TextField(blank=True, default="")
    body_hash = models.CharField(max_length=64)
    attachments = models.JSONField(default=list, blank=True)
    reply = models.TextField(blank=True, default="")
    stream_seq = models.IntegerField(default=0)  # last chat event seq sent for this run
    error_kind = models.CharField(max_length=32, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    stop_reason = models.CharField(max_length=32, blank=True, default="")
    timeout_ms = models.IntegerField()
    owner_process = models.CharField(max_length=64, blank=True, default="", db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    prompt_tokens = models.IntegerField(null=True, blank=True)
    completion_tokens = models.IntegerField(null=True, blank=True)
    cancel_ms = models.IntegerField(null=True, blank=True)
    # how many tool calls the run recorded: its terminal transition looks for open calls only when > 0
    tool_calls = models.IntegerField(default=0, db_default=0)
    # how many steering messages the run took (`lifecycle.steering`): only then is its reply in parts
    steers = models.IntegerField(default=0, db_default=0)
    surface = models.CharField(
        max_length=8, choices=RunSurface.choices, default=RunSurface.WEBSOCKET, db_default=RunSurface.WEBSOCKET
    )
    # What an HTTP request adds to the run (`sessions_app.run_requests.RunRequest.as_json`); NULL for a chat.send.
    request = models.JSONField(null=True, blank=True)
    # The reply's length after each stored delta, in order: the boundaries of the deltas clients were sent,
    # so a resumed Responses stream replays the same events with the same numbers (HTTP-API.md §14.5).
    marks = models.JSONField(default=list, blank=True, db_default=[])
    # Where the run's messages go when not after the session's active leaf (docs/branches.md): `prompt`,
    # the user message it answers again (a regenerated reply: it adds no user message of its own);
    # `follows`, the message its own user message follows (a `previous_response_id` continuing its branch).
    prompt = message_pointer()
    follows = message_pointer()
    # Set while an HTTP run with an Idempotency-Key has no client: aborted unless a retry reattaches (§14.6).
    detached_at = models.DateTimeField(null=True, blank=True)
    # What admission reserved against budgets (`lifecycle.usage.Reservation.as_json`); NULL: none applied.
    budget = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "run_id"], name="uniq_run_session_key")]
        indexes = [
            models.Index(fields=["session", "state", "queue_seq"], name="run_session_state_q"),
            models.Index(fields=["state", "owner_process"], name="run_state_owner"),
            # operators search by runId across sessions (the unique key starts with session)
            models.Index(fields=["run_id"], name="run_run_id"),
            # the runs admin: by error kind (newest first) and sorted by creation
            models.Index(fields=["error_kind", "id"], name="run_error_kind_id"),
            models.Index(fields=["created_at", "id"], name="run_created_id"),
            # the runs admin's surface filter; the sweep of detached HTTP runs
            models.Index(fields=["surface", "id"], name="run_surface_id"),
            models.Index(fields=["detached_at"], name="run_detached", condition=models.Q(detached_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Message(models.Model):
    """One transcript entry of a session generation, after its `parent` (NULL: the first of its branch).

    The transcript is a tree: regenerate, edit, rewind and branch switches add siblings and move the
    session's `active_leaf`; nothing is deleted. A parent is always older (a smaller id) than its children.
    """

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    session_generation = models.UUIDField()
    # of the same session and generation; they are deleted together, never one alone (indexed: children)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="children", db_constraint=False
    )
    role = models.CharField(max_length=16)  # user | assistant
    text = models.TextField(blank=True, default="")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    aborted = models.BooleanField(default=False)
    # Set on an inline command (/status, /think, ...) and its answer: the idempotencyKey of the send
    # that made them (its ack's runId; no run exists under it). Shown in history, never sent to a model.
    command_key = models.CharField(max_length=128, blank=True, default="", db_default="")
    # A part of a steered run's reply (docs/protocol-notes.md, "Steering"): its text starts at `reply_start`
    # of the run's reply, and it carries the calls of steps `first_step` to `last_step` (0: every later
    # step). A run never steered has one assistant message: 0, 1, 0.
    reply_start = models.IntegerField(default=0, db_default=0)
    first_step = models.IntegerField(default=1, db_default=1)
    last_step = models.IntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["session", "session_generation", "id"], name="msg_session_gen")]

    def __str__(self) -> str:
        return f"{self.role}: {self.text[:40]}"


class CommandReceipt(models.Model):
    """An inline command's first answer, under the idempotencyKey of its send (no run exists under
    it): a retry under that key is answered from here and changes nothing. It outlives a reset (a
    retried /new must not reset again) and goes with its session."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="command_receipts")
    key = models.CharField(max_length=128)  # the send's idempotencyKey (its ack's runId)
    text = models.TextField()  # the command as typed: a retry under the key must send the same
    reply = models.TextField()
    run_ids = models.JSONField(default=list)  # the runs it stopped (/stop, /new, /reset)
    session_generation = models.UUIDField()  # the sessionId it answered with (/new's: the new one)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "key"], name="uniq_command_session_key")]

    def __str__(self) -> str:
        return f"{self.key}: {self.text[:40]}"


class ToolCallState(models.TextChoices):
    PENDING = "pending"  # recorded; not started (an earlier call of its step runs, or approval allowed it)
    PENDING_APPROVAL = "pending_approval"  # waiting for its approval's decision
    RUNNING = "running"  # committed before the request is written to the MCP server
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # bad arguments, unknown tool, server trouble, the tool's error or timeout
    DENIED = "denied"
    EXPIRED = "expired"  # its approval had no decision in time
    CANCELLED = "cancelled"  # its run ended first (abort, timeout, reset, delete), or never started
    UNKNOWN = "unknown"  # its process died while it ran: whether it took effect is not known
    CLIENT = "client"  # a client function tool (HTTP-API.md §14.4): handed to the API client, never run here
    SKIPPED = "skipped"  # not started: a steering message reached its run first (docs/protocol-notes.md, "Steering")


TOOL_OPEN_STATES = (ToolCallState.PENDING, ToolCallState.PENDING_APPROVAL, ToolCallState.RUNNING)
TOOL_TERMINAL_STATES = (
    ToolCallState.SUCCEEDED,
    ToolCallState.FAILED,
    ToolCallState.DENIED,
    ToolCallState.EXPIRED,
    ToolCallState.CANCELLED,
    ToolCallState.UNKNOWN,
    ToolCallState.CLIENT,
    ToolCallState.SKIPPED,
)


class ToolErrorKind(models.TextChoices):
    """Why a call ended other than `succeeded` (its `errorKind`, TOOLS.md §13.6; docs/tools.md)."""

    BAD_ARGUMENTS = "bad_arguments"  # not JSON, not an object, over 64 KiB
    UNKNOWN_TOOL = "unknown_tool"  # not a tool this agent may call (not listed, or not allowed)
    LIMIT = "limit"  # past max_tool_calls
    TOOL_TIMEOUT = "tool_timeout"  # tool_timeout_ms
    TOOL_SERVER = "tool_server"  # server missing, crashed, answered garbage
    TOOL_ERROR = "tool_error"  # the tool's own error (isError)
    DENY = "deny"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"  # not started: the run took a steering message first


# the one terminal state each kind comes with
TOOL_ERROR_KIND_STATES: dict[str, str] = {
    ToolErrorKind.BAD_ARGUMENTS: ToolCallState.FAILED,
    ToolErrorKind.UNKNOWN_TOOL: ToolCallState.FAILED,
    ToolErrorKind.LIMIT: ToolCallState.FAILED,
    ToolErrorKind.TOOL_TIMEOUT: ToolCallState.FAILED,
    ToolErrorKind.TOOL_SERVER: ToolCallState.FAILED,
    ToolErrorKind.TOOL_ERROR: ToolCallState.FAILED,
    ToolErrorKind.DENY: ToolCallState.DENIED,
    ToolErrorKind.EXPIRED: ToolCallState.EXPIRED,
    ToolErrorKind.CANCELLED: ToolCallState.CANCELLED,
    ToolErrorKind.UNKNOWN: ToolCallState.UNKNOWN,
    ToolErrorKind.SKIPPED: ToolCallState.SKIPPED,
}


class ToolCall(models.Model):
    """One tool call of a run (TOOLS.md §13): runs at most once, ends in exactly one terminal state."""

    call_id = models.CharField(max_length=40, unique=True)  # the gateway's toolCallId ("tc_…")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tools")
    seq = models.IntegerField()  # order within the run, from 1
    step = models.IntegerField()  # the model call that asked for it, from 1
    model_call_id = models.CharField(max_length=128, blank=True, default="")  # the model's own id
    server = models.CharField(max_length=32, blank=True, default="")
    tool = models.CharField(max_length=128)  # the MCP tool's name (or what the model asked for)
    arguments = models.TextField(blank=True, default="")  # as the model sent them (JSON text)
    state = models.CharField(max_length=16, choices=ToolCallState.choices, default=ToolCallState.PENDING)
    result = models.TextField(blank=True, default="")  # capped (max_tool_result_bytes)
    is_error = models.BooleanField(default=False)
    error_kind = models.CharField(max_length=32, blank=True, default="")  # a ToolErrorKind; "" for succeeded
    reply_offset = models.IntegerField(default=0)  # how much reply text came before it
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="uniq_toolcall_run_seq")]
        indexes = [
            models.Index(fields=["state", "ended_at"], name="toolcall_state_ended"),
            models.Index(fields=["ended_at", "id"], name="toolcall_ended_id"),
        ]

    def __str__(self) -> str:
        return f"{self.call_id} {self.name} ({self.state})"

    @property
    def name(self) -> str:
        """`server.tool` (TOOLS.md §13.3)."""
        return f"{self.server}.{self.tool}" if self.server else self.tool

    @property
    def is_terminal(self) -> bool:
        return self.state in TOOL_TERMINAL_STATES

    @property
    def duration_ms(self) -> int | None:
        """From its start (`running`) to its end; None for a call that never ran or has not ended."""
        if self.started_at is None or self.ended_at is None:
            return None
        return max(0, int((self.ended_at - self.started_at).total_seconds() * 1000))


class ApprovalDecision(models.TextChoices):
    ALLOW_ONCE = "allow-once"
    DENY = "deny"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ToolApprovalQuerySet(models.QuerySet["ToolApproval"]):
    def pending(self) -> ToolApprovalQuerySet:
        """Still waiting for a decision (the one definition: no decision recorded)."""
        return self.filter(decision="")

    def resolved(self) -> ToolApprovalQuerySet:
        return self.exclude(decision="")


class ToolApproval(models.Model):
    """The approval a tool call waits for; the first decision wins."""

    approval_id = models.CharField(max_length=40, unique=True)  # "ap_…"
    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="approval")
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="approvals")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    decision = models.CharField(max_length=16, choices=ApprovalDecision.choices, blank=True, default="")
    decided_by = models.CharField(max_length=150, blank=True, default="")  # user name, or "system"
    decided_by_user_id = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = ToolApprovalQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(fields=["owner", "decision"], name="approval_owner_decision"),
            models.Index(fields=["decision", "expires_at"], name="approval_decision_expires"),
        ]

    def __str__(self) -> str:
        return f"{self.approval_id} ({self.decision or 'pending'})"

    @property
    def pending(self) -> bool:
        return not self.decision


class LifecycleEvent(models.Model):
    """Audit row: one per run transition (and per session-level change, tool call and approval change)."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="audit")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="audit")
    tool_call = models.ForeignKey(ToolCall, null=True, blank=True, on_delete=models.CASCADE, related_name="audit")
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    reason = models.CharField(max_length=64)
    actor = models.CharField(max_length=16, choices=Actor.choices)
    detail = models.TextField(blank=True, default="")
    # Which operator acted (actor `operator`): the user's id and name at the time.
    # Not a foreign key, so the record outlives the user account.
    actor_user_id = models.IntegerField(null=True, blank=True)
    actor_name = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["session", "id"], name="audit_session")]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state or '-'} ({self.reason})"


class SessionTombstone(models.Model):
    """What is left of a deleted or pruned session: who, what, when, and who deleted it.

    The session's own audit rows go with it; this row stays (and is also logged on
    `sessions_app.audit`), so "where did my conversation go" always has an answer.
    """

    session_pk = models.BigIntegerField()
    key = models.CharField(max_length=220)
    owner_id = models.IntegerField(null=True, blank=True)
    session_id = models.UUIDField(null=True, blank=True)
    reason = models.CharField(max_length=16)  # delete | prune
    actor_name = models.CharField(max_length=150, blank=True, default="")
    actor_user_id = models.IntegerField(null=True, blank=True)
    last_updated_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["key"], name="tombstone_key")]

    def __str__(self) -> str:
        return f"{self.key} ({self.reason})"


class KeyScope(models.TextChoices):
    """What an API key may do (HTTP-API.md §14.1; the WebSocket's scopes of the same names, §2.4)."""

    READ = "read"
    WRITE = "write"
    APPROVALS = "approvals"
    ADMIN = "admin"


def default_key_scopes() -> list[str]:
    return [KeyScope.READ, KeyScope.WRITE, KeyScope.APPROVALS]


class ApiToken(models.Model):
    """A bearer token for API clients; only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = models.JSONField(default=default_key_scopes)  # KeyScope values

    class Meta:
        verbose_name = "API token"
        indexes = [
            # the keys admin's "revoked" filter and its count: one key in ten, read from this index
            models.Index(
                fields=["revoked_at", "id"], name="apitoken_revoked", condition=models.Q(revoked_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ApiResponse(models.Model):
    """A Responses API response (HTTP-API.md §14.5): its id, what it was asked, and the run that answers it.

    Its status, output and events are derived from the run, its marks and its tool calls, never stored
    apart from them, so a response is never ahead of its run. An approval answered over HTTP continues
    the same response (and run)."""

    response_id = models.CharField(max_length=40, unique=True)  # "resp_" + 32 hex
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="response")
    model = models.CharField(max_length=200)  # as the request named it
    store = models.BooleanField(default=True)
    background = models.BooleanField(default=False)
    previous_response_id = models.CharField(max_length=40, blank=True, default="")
    input_items = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "-created_at"], name="response_owner_created")]

    def __str__(self) -> str:
        return self.response_id


class GatewayProcess(models.Model):
    """A server process that owns runs; it heartbeats while alive."""

    server_id = models.CharField(max_length=64, primary_key=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(db_index=True)
    stopping = models.BooleanField(default=False)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "gateway processes"

    def __str__(self) -> str:
        return self.server_id


from sessions_app.file_models import RunFile, StoredFile  # noqa: E402,F401  (uploaded and attached files)
from sessions_app.usage_models import Budget, BudgetPeriod, BudgetScope, UsageRecord  # noqa: E402,F401  (usage and budgets)
