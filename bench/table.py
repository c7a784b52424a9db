"""The table `bench/run.py` prints: one row per figure, the floor beside the gateway."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

Results = dict[str, dict[str, list[dict[str, float]]]]


@dataclass
class Row:
    """One line of the table: `scenario`'s `metric`, with a target check on the gateway's medians."""

    row: str
    label: str
    scenario: str
    metric: str
    target: str = "-"
    check: Callable[[Callable[[str, str], float]], bool] | None = None
    fmt: str = "{:.1f}"
    compare: bool = True  # False: a ratio already, whose agentgate / floor quotient would mean nothing


def triple(values: list[float], fmt: str) -> str:
    if not values:
        return "n/a"
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def render(table_rows: list[Row], results: Results, extra: list[list[str]], only: set[str] | None) -> tuple[str, bool]:
    """The table (floor and gateway min / median / max of each row, their ratio, the target and
    whether the gateway's median meets it) and whether every checked target is met. A row whose
    scenario was left out by `--only` is left out (a derived one is shown when its figures exist).
    `extra` lines (the PostgreSQL + Redis rows, `bench/pg_rows.py`) come last, as they are."""

    def values(side: str, scenario: str, metric: str) -> list[float]:
        return [r[metric] for r in results.get(side, {}).get(scenario, []) if metric in r]

    def med(scenario: str, metric: str) -> float:
        vals = values("agentgate", scenario, metric)
        return statistics.median(vals) if vals else math.nan

    header = ["row", "measure", "floor min/med/max", "agentgate min/med/max", "ratio", "target", "met?"]
    table: list[list[str]] = []
    all_met = True
    for row in table_rows:
        if only is not None and row.scenario not in only and not values("agentgate", row.scenario, row.metric):
            continue
        floor, gate = values("floor", row.scenario, row.metric), values("agentgate", row.scenario, row.metric)
        ratio = "-"
        if row.compare and floor and gate and statistics.median(floor):
            ratio = f"{statistics.median(gate) / statistics.median(floor):.2f}x"
        met = "-"
        if row.check is not None and gate:
            try:
                ok = row.check(med)
            except (KeyError, ValueError):
                ok = False
            met = "yes" if ok else "NO"
            all_met = all_met and ok
        table.append([row.row, row.label, triple(floor, row.fmt), triple(gate, row.fmt), ratio, row.target, met])
    for line in extra:
        table.append(line)
        all_met = all_met and line[-1] != "NO"
    widths = [max(len(header[i]), *(len(r[i]) for r in table)) for i in range(len(header))]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(lines), all_met
