"""Where a profiled gateway's time went, per turn: own time (cProfile's tottime) summed by area
(the project's rooms, Django's database layer, SQLite, daphne/Twisted, asyncio, ...), and the
functions with the most own time. Given two profiles (`--against`), each area's difference too.

    .venv/bin/python bench/profile_report.py DIR/gateway.prof --turns 514 \\
        --against OTHER/gateway.prof --against-turns 613

`--turns` is how many turns the profiled server ran (warm-up included): the bench's JSON
(`--json`) has turns/s and the seconds. The server's start is in every profile alike, so read the
differences between two profiles rather than one profile's absolute figures.
"""

from __future__ import annotations

import argparse
import pstats
import re
from collections import defaultdict
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent) + "/"

# (label, a piece of the file path that puts a function there), first match wins
AREAS = [
    ("chat/httpapi", "/chat/httpapi/"),
    ("chat/websocket", "/chat/websocket/"),
    ("chat/delivery", "/chat/delivery/"),
    ("chat/runtime", "/chat/runtime/"),
    ("chat/methods", "/chat/methods/"),
    ("chat/protocol", "/chat/protocol/"),
    ("chat/base", "/chat/base/"),
    ("chat (other)", "/chat/"),
    ("sessions_app", "/sessions_app/"),
    ("django db", "/django/db/"),
    ("django (other)", "/django/"),
    ("sqlite3 / psycopg", "sqlite"),  # a C name: `SQLiteCursorWrapper.execute`, `sqlite3.Cursor`
    ("sqlite3 / psycopg", "psycopg"),
    ("daphne", "/daphne/"),
    ("twisted", "/twisted/"),
    ("autobahn", "/autobahn/"),
    ("channels", "/channels/"),
    ("asyncio", "/asyncio/"),
    ("json", "/json/"),
    ("threading / queue / concurrent", "/threading.py"),
    ("threading / queue / concurrent", "/queue.py"),
    ("threading / queue / concurrent", "/concurrent/"),
    ("prometheus", "/prometheus_client/"),
    ("logging", "/logging/"),
]


# C functions that block (their wall time is waiting, not CPU): left out of every figure
WAITS = ("SimpleQueue' objects>", "'acquire' of '_thread.lock", "'poll' of 'select.epoll", "time.sleep", "'select' of")


def area(filename: str, name: str) -> str:
    if filename == "~" and any(wait in name for wait in WAITS):
        return ""
    if filename == "~":  # a C function: named like `<method 'execute' of 'sqlite3.Cursor' objects>`
        for label, piece in AREAS:
            if piece.strip("/").lower() in name.lower():
                return label
        return "C builtins"
    for label, piece in AREAS:
        if piece in filename:
            return label
    return "other Python"


def by_area(stats: pstats.Stats) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        totals[area(filename, name)] += tottime
    totals.pop("", None)
    return totals


def per_function(stats: pstats.Stats, turns: float) -> dict[str, tuple[float, float]]:
    """Each function (waits left out): (own ms per turn, calls per turn)."""
    found: dict[str, tuple[float, float]] = {}
    for (filename, line, name), (_cc, calls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if not area(filename, name):
            continue
        where = filename.split("site-packages/")[-1].split("/lib/python3")[-1]
        if "/" in where and ROOT in where:
            where = where.split(ROOT, 1)[1]
        key = f"{where}:{line} {name}" if filename != "~" else re.sub(r" at 0x[0-9a-f]+", "", name)
        ms, calls_before = found.get(key, (0.0, 0.0))  # a C function's address differs between runs
        found[key] = (ms + tottime * 1000 / turns, calls_before + calls / turns)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile")
    parser.add_argument("--turns", type=float, required=True)
    parser.add_argument("--against", default="")
    parser.add_argument("--against-turns", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    stats = pstats.Stats(args.profile)
    mine = {k: v * 1000 / args.turns for k, v in by_area(stats).items()}
    other: dict[str, float] = {}
    if args.against:
        other = {k: v * 1000 / args.against_turns for k, v in by_area(pstats.Stats(args.against)).items()}
    head = "own time per turn, ms (waits left out; cProfile's overhead in)"
    print(head + "  | against | difference" * bool(other))
    for label in sorted(set(mine) | set(other), key=lambda k: -(mine.get(k, 0.0) - other.get(k, 0.0))):
        line = f"  {label:<32} {mine.get(label, 0.0):7.3f}"
        if other:
            line += f"  | {other.get(label, 0.0):7.3f} | {mine.get(label, 0.0) - other.get(label, 0.0):+7.3f}"
        print(line)
    total = sum(mine.values())
    print(f"  {'total':<32} {total:7.3f}" + (f"  | {sum(other.values()):7.3f}" if other else ""))
    functions = per_function(stats, args.turns)
    print(f"\nfunctions with the most own time (ms per turn, calls per turn) in {args.profile}:")
    for key, (ms, calls) in sorted(functions.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {ms:7.3f}  {calls:7.1f}  {key}")
    if args.against:
        against = per_function(pstats.Stats(args.against), args.against_turns)
        print("\nfunctions whose own time per turn grew most (ms, then calls per turn: this | against):")
        grew = sorted(functions, key=lambda k: -(functions[k][0] - against.get(k, (0.0, 0.0))[0]))
        for key in grew[: args.top]:
            (ms, calls), (ms0, calls0) = functions[key], against.get(key, (0.0, 0.0))
            print(f"  {ms - ms0:+7.3f}  {ms:7.3f} | {ms0:7.3f}  {calls:6.1f} | {calls0:6.1f}  {key}")


if __name__ == "__main__":
    main()
