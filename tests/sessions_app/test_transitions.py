"""§8's run state machine, as the table the lifecycle service checks every transition against."""

import pytest

from sessions_app.transitions import ALLOWED, sources_for

TERMINAL = {"done", "failed", "killed", "timeout"}


def test_the_table_is_the_spec() -> None:
    assert ALLOWED["queued"] == {"dispatching", "failed", "killed", "timeout"}
    assert ALLOWED["dispatching"] == {"running", "failed", "killed", "timeout"}
    assert ALLOWED["running"] == TERMINAL
    for state in TERMINAL:
        assert ALLOWED[state] == frozenset(), f"{state} is terminal: nothing leaves it"


@pytest.mark.parametrize(
    "target, sources",
    [
        ("done", {"running"}),  # only a run that started can complete
        ("killed", {"queued", "dispatching", "running"}),
        ("running", {"dispatching"}),
        ("dispatching", {"queued"}),
    ],
)
def test_sources(target: str, sources: set[str]) -> None:
    assert set(sources_for(target)) == sources
