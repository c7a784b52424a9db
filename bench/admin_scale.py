"""Operator tooling at scale: seed speed, admin query counts and timings, index use.

Usage (from the repository root; the database file is created and migrated):

    .venv/bin/python bench/admin_scale.py --sessions 100000 --runs 1000000 --db /tmp/agentgate-bench.sqlite3

Prints one line per measurement and, with --json FILE, writes them all to FILE.
Only a throwaway database is touched; the last step (prune) deletes from it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--db", required=True, help="SQLite file to create (overwritten)")
    parser.add_argument("--repeat", type=int, default=5, help="requests per page (median reported)")
    parser.add_argument("--json", dest="json_out", default=None)
    parser.add_argument("--keep", action="store_true", help="reuse an existing seeded --db instead of seeding")
    args = parser.parse_args()

    db = Path(args.db)
    if not args.keep:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "gatewayproject.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from sessions_app import doctor, ops_selectors, retention
    from sessions_app.models import ChatSession, Run

    results: dict[str, Any] = {"sessions": args.sessions, "runs": args.runs}

    def report(name: str, **values: Any) -> None:
        results[name] = values
        print(f"{name:42} " + "  ".join(f"{k}={v}" for k, v in values.items()), flush=True)

    call_command("migrate", verbosity=0)
    if not args.keep:
        started = time.perf_counter()
        call_command("seed_demo_data", sessions=args.sessions, runs=args.runs, progress="never", stdout=io.StringIO())
        seconds = time.perf_counter() - started
        report("seed_demo_data", seconds=round(seconds, 1), runs_per_s=int(args.runs / seconds) if seconds else 0)
    report("rows", sessions=ChatSession.objects.count(), runs=Run.objects.count())

    setup_test_environment()
    from django.contrib.auth import get_user_model

    User = get_user_model()
    admin_user = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", password="bench-password"
    )
    client = Client()
    client.force_login(admin_user)
    session = ChatSession.objects.filter(active_run__isnull=False).first() or ChatSession.objects.first()
    run = Run.objects.order_by("-pk").first()
    assert session is not None and run is not None
    pages = {
        "changelist": "/admin/sessions_app/chatsession/",
        "changelist ?stuck=yes": "/admin/sessions_app/chatsession/?stuck=yes",
        "changelist ?failed=24h": "/admin/sessions_app/chatsession/?failed=24h",
        "changelist ?status=failed": "/admin/sessions_app/chatsession/?status=failed",
        "changelist deep page": f"/admin/sessions_app/chatsession/?p={max(1, min(500, args.sessions // 50))}",
        "changelist search runId": f"/admin/sessions_app/chatsession/?q={run.run_id}",
        "changelist search owner": "/admin/sessions_app/chatsession/?q=seed-user-7",
        "session detail": f"/admin/sessions_app/chatsession/{session.pk}/change/",
        "run changelist": "/admin/sessions_app/run/",
        "run changelist search": f"/admin/sessions_app/run/?q={run.run_id}",
        "run detail": f"/admin/sessions_app/run/{run.pk}/change/",
    }
    for name, url in pages.items():
        timings = []
        queries = 0
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get(url)
                timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
            queries = len(captured.captured_queries)
        report(f"admin {name}", queries=queries, median_ms=round(statistics.median(timings), 1))

    def plan(qs: Any) -> list[str]:
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return [row[-1] for row in cursor.fetchall()]

    for name, qs in {
        "stuck filter": ops_selectors.stuck_sessions(),
        "failed 24h filter": ops_selectors.failed_sessions(),
        "running": ops_selectors.running_sessions(),
    }.items():
        steps = plan(qs)
        scans = [s for s in steps if s.startswith("SCAN")]
        started = time.perf_counter()
        count = qs.count()
        report(f"plan {name}", rows=count, ms=round((time.perf_counter() - started) * 1000, 1),
               full_scans=len(scans), plan=" | ".join(steps))

    started = time.perf_counter()
    findings = doctor.check()
    report("gateway_doctor check", findings=len(findings), ms=round((time.perf_counter() - started) * 1000, 1))
    started = time.perf_counter()
    response = client.get("/metrics")
    report("/metrics scrape", status=response.status_code, ms=round((time.perf_counter() - started) * 1000, 1))

    started = time.perf_counter()
    call_command("recover_runs", stdout=io.StringIO())
    report("recover_runs", ms=round((time.perf_counter() - started) * 1000, 1),
           stuck_after=ops_selectors.stuck_sessions().count())

    candidates = retention.count_candidates(60)
    started = time.perf_counter()
    pruned = retention.prune_sessions(older_than_days=60)
    seconds = time.perf_counter() - started
    report("prune_sessions --older-than-days 60", sessions=pruned.sessions, runs=pruned.runs,
           candidates=candidates, seconds=round(seconds, 1),
           sessions_per_s=int(pruned.sessions / seconds) if seconds else 0)

    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
