"""Reads of a transcript's branches: THE active branch, and the tree it is one path of.

A transcript is a tree of messages (`Message.parent`); a branch is a message and its parents up to
the first. The active branch is the one ending at the session's `active_leaf`: what history shows,
what the agent's model is sent (a run's branch ends at its prompt, which is the active leaf while it
runs), what an HTTP continuation follows. Every read of "the conversation" goes through `path`.
A parent is always older than its children (its id smaller), so a branch in id order is in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache

from django.db import connection

from sessions_app.models import ChatSession, Message

HEADLINE_CHARS = 120  # as OpenClaw's branch menu cuts a headline


@cache
def _path_sql(vendor: str, below: bool, conversation: bool, limited: bool) -> str:
    table = connection.ops.quote_name(Message._meta.db_table)
    where = [w for w, on in (("id < %s", below), ("command_key = ''", conversation)) if on]
    # The walk goes from the leaf up, one parent at a time (each an index lookup by id), and yields the
    # nearest first: with a LIMIT it stops once it has enough.
    return (
        f"WITH RECURSIVE path(id, parent_id, command_key) AS ("
        f"SELECT id, parent_id, command_key FROM {table} WHERE id = %s "
        f"UNION ALL SELECT m.id, m.parent_id, m.command_key FROM {table} m JOIN path p ON m.id = p.parent_id) "
        f"SELECT id FROM path{' WHERE ' + ' AND '.join(where) if where else ''}{' LIMIT %s' if limited else ''}"
    )


def path_ids(
    leaf_id: int | None, *, limit: int | None = None, before_id: int | None = None, conversation: bool = False
) -> list[int]:
    """THE branch ending at `leaf_id`: its message ids, newest first (the newest `limit`, those older than
    `before_id`; `conversation`: without inline commands and their answers, which no model reads)."""
    if leaf_id is None or (limit is not None and limit <= 0):
        return []
    params: list[int] = [leaf_id]
    if before_id is not None:
        params.append(before_id)
    if limit is not None:
        params.append(limit)
    sql = _path_sql(connection.vendor, before_id is not None, conversation, limit is not None)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def path(
    leaf_id: int | None, *, limit: int | None = None, before_id: int | None = None, conversation: bool = False
) -> list[Message]:
    """The messages of `path_ids`, oldest first."""
    ids = path_ids(leaf_id, limit=limit, before_id=before_id, conversation=conversation)
    return list(Message.objects.filter(pk__in=ids).order_by("id")) if ids else []


def active_path(
    session: ChatSession, *, limit: int | None = None, before_id: int | None = None, conversation: bool = False
) -> list[Message]:
    """The session's active branch (of its current transcript), oldest first."""
    return path(session.active_leaf_id, limit=limit, before_id=before_id, conversation=conversation)


def depth(message_id: int | None) -> int:
    """How many messages the branch ending at `message_id` holds (0 for None)."""
    return len(path_ids(message_id))


def regeneration_text(owner_id: int, key: str, entry_id: int) -> str:
    """The text a regeneration of `entry_id` would send (a reply's user message, or the user message
    itself): what setup checks look at before admission, which decides under the session lock ("" when
    there is none)."""
    message = Message.objects.filter(pk=entry_id, session__owner_id=owner_id, session__key=key).first()
    if message is not None and message.role == "assistant" and message.parent_id is not None:
        message = Message.objects.filter(pk=message.parent_id).first()
    return message.text if message is not None else ""


# --- the tree: branch menus and sibling switchers ------------------------------------------------


@dataclass
class Node:
    id: int
    parent_id: int | None
    role: str
    created_at: datetime
    children: list[int] = field(default_factory=list)


@dataclass
class Tree:
    """The messages of a session's current transcript as a tree (text not read)."""

    nodes: dict[int, Node]
    roots: list[int]
    leaf_id: int | None

    def tips(self) -> list[int]:
        """The ends of its branches: messages without children (and the active leaf, which may have some
        after a rewind)."""
        ends = {n.id for n in self.nodes.values() if not n.children}
        if self.leaf_id is not None and self.leaf_id in self.nodes:
            ends.add(self.leaf_id)
        return sorted(ends)

    def siblings(self, message_id: int) -> list[int]:
        """The message and its siblings (the children of its parent, or the first messages), oldest first."""
        node = self.nodes[message_id]
        return list(self.roots if node.parent_id is None else self.nodes[node.parent_id].children)

    def newest_tip_under(self, message_id: int) -> int:
        """The branch end to switch to for a message: the active leaf if it is on the message's branch,
        else the newest end below it."""
        below = [message_id]
        found: set[int] = set()
        while below:
            current = below.pop()
            found.add(current)
            below.extend(self.nodes[current].children)
        if self.leaf_id in found:
            return self.leaf_id  # type: ignore[return-value]
        return max(i for i in found if not self.nodes[i].children)

    def path(self, leaf_id: int) -> list[int]:
        ids = []
        current: int | None = leaf_id
        while current is not None and current in self.nodes:
            ids.append(current)
            current = self.nodes[current].parent_id
        return ids


def tree(session: ChatSession) -> Tree:
    """The current transcript's tree (one read of ids, parents, roles and times)."""
    rows = Message.objects.filter(session=session, session_generation=session.session_id).order_by("id")
    nodes: dict[int, Node] = {}
    roots: list[int] = []
    for pk, parent_id, role, created in rows.values_list("pk", "parent_id", "role", "created_at"):
        nodes[pk] = Node(pk, parent_id, role, created)
        parent = nodes.get(parent_id) if parent_id is not None else None
        if parent is not None:
            parent.children.append(pk)
        else:
            roots.append(pk)
    return Tree(nodes, roots, session.active_leaf_id)


def sibling_counts(messages: Sequence[Message]) -> dict[int, int]:
    """How many siblings (itself included) each of these messages of one transcript has, for those with
    more than one (one read, bounded by the messages given)."""
    if not messages:
        return {}
    first = messages[0]
    parents = {m.parent_id for m in messages}
    counts: dict[int | None, int] = {}
    same = Message.objects.filter(session_id=first.session_id, session_generation=first.session_generation)
    for parent_id in parents - {None}:
        counts[parent_id] = 0
    rows = same.filter(parent_id__in=parents - {None}).values_list("parent_id", flat=True)
    for parent_id in rows:
        counts[parent_id] = counts.get(parent_id, 0) + 1
    if None in parents:
        counts[None] = same.filter(parent=None).count()
    return {m.pk: counts[m.parent_id] for m in messages if counts.get(m.parent_id, 0) > 1}


@dataclass(frozen=True)
class Siblings:
    """A message among its siblings: its place (from 1) and, for each, the branch end it leads to."""

    index: int
    leaves: list[str]


def siblings_of(session: ChatSession, messages: Sequence[Message]) -> dict[int, Siblings]:
    """The siblings of those of these messages (of the active branch) that have any: one bounded read,
    and the tree read only when some have."""
    counts = sibling_counts(messages)
    if not counts:
        return {}
    t = tree(session)
    found = {}
    for pk in counts:
        if pk in t.nodes:
            among = t.siblings(pk)
            found[pk] = Siblings(among.index(pk) + 1, [str(t.newest_tip_under(s)) for s in among])
    return found


@dataclass(frozen=True)
class BranchSummary:
    """One branch as OpenClaw's `sessions.branches.list` shows it."""

    leaf_id: int
    headline: str
    message_count: int
    updated_at: datetime
    active: bool


def summaries(session: ChatSession) -> list[BranchSummary]:
    """The current transcript's branches, the active one first, then the newest first."""
    t = tree(session)
    tips = t.tips()
    return _summaries_of(t, tips, dict(Message.objects.filter(pk__in=set(tips)).values_list("pk", "text")))


def _summaries_of(t: Tree, tips: list[int], texts: dict[int, str]) -> list[BranchSummary]:
    paths = {tip: t.path(tip) for tip in tips}
    found = []
    for tip in sorted(tips, key=lambda i: (i != t.leaf_id, -i)):
        found.append(
            BranchSummary(
                leaf_id=tip,
                headline=headline(texts.get(tip, "")),
                message_count=len(paths[tip]),
                updated_at=t.nodes[tip].created_at,
                active=tip == t.leaf_id,
            )
        )
    return found


@dataclass(frozen=True)
class ShownMessage:
    pk: int
    role: str
    headline: str


@dataclass(frozen=True)
class BranchView:
    """What an operator's page shows: the newest `limit` messages of the active branch, and every branch."""

    shown: list[ShownMessage]
    ends: list[BranchSummary]


def branch_view(session: ChatSession, *, limit: int) -> BranchView:
    """`BranchView` in two statements whatever the transcript's size: its tree, then the texts shown."""
    t = tree(session)
    path_ids = list(reversed(t.path(t.leaf_id)[:limit])) if t.leaf_id is not None else []
    tips = t.tips()
    texts = dict(Message.objects.filter(pk__in={*path_ids, *tips}).values_list("pk", "text"))
    shown = [ShownMessage(pk, t.nodes[pk].role, headline(texts.get(pk, ""))) for pk in path_ids]
    return BranchView(shown, _summaries_of(t, tips, texts))


def headline(text: str) -> str:
    """A message's text on one line, cut at `HEADLINE_CHARS` (with an ellipsis when cut)."""
    line = " ".join(text.split())
    return line if len(line) <= HEADLINE_CHARS else line[: HEADLINE_CHARS - 1] + "…"


# --- writing a whole transcript as one branch (data written in bulk: migrations, seeding) -----------


def link_as_one_branch(session_pks: Sequence[int]) -> None:
    """Each of these sessions' messages follows the one before it in its generation, and each session's
    active leaf is the newest message of its current generation: what bulk writers that insert messages
    without parents (seeding) call after them. Set-based: one statement per step."""
    if not session_pks:
        return
    msg = connection.ops.quote_name(Message._meta.db_table)
    ses = connection.ops.quote_name(ChatSession._meta.db_table)
    marks = ", ".join(["%s"] * len(session_pks))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {msg} SET parent_id = (SELECT MAX(p.id) FROM {msg} p WHERE p.session_id = {msg}.session_id "
            f"AND p.session_generation = {msg}.session_generation AND p.id < {msg}.id) WHERE session_id IN ({marks})",
            list(session_pks),
        )
        cursor.execute(
            f"UPDATE {ses} SET active_leaf_id = (SELECT MAX(m.id) FROM {msg} m "
            f"WHERE m.session_id = {ses}.id AND m.session_generation = {ses}.session_id) WHERE id IN ({marks})",
            list(session_pks),
        )
