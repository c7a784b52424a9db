"""Operator tooling at scale: seed speed, admin query counts and timings, index use.

Usage (from the repository root; the database is created and migrated):

    # SQLite: a throwaway file, seeded each time (unless --keep)
    .venv/bin/python bench/admin_scale.py --sessions 100000 --runs 1000000 --db /tmp/agentgate-bench.sqlite3
    # PostgreSQL: a dedicated database, seeded once (with --transcripts, then VACUUM ANALYZE)
    # and kept; later runs only measure
    createdb agentgate_scale
    .venv/bin/python bench/admin_scale.py --sessions 100000 --runs 1000000 \
        --database-url postgres://postgres@127.0.0.1:5432/agentgate_scale

With --keys N, N API keys are added (once) among the seeded users and the API keys admin is
measured too (its list, filters, search, a deep page, a key's page).

Prints one line per measurement and, with --json FILE, writes them all to FILE.
On PostgreSQL each list query's plan is checked for sequential scans of the runs and
sessions tables. Only with --mutate are recover_runs and prune run (they change data;
always on a throwaway SQLite file).
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


def seed_keys(count: int) -> None:
    """`count` API keys among the seeded users, in batches: mostly the default scopes, some read-only,
    a few with admin; one in ten revoked; most used. Only their rows: a bench has no use for the raw keys."""
    import hashlib
    import random

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from sessions_app.models import ApiToken

    rng = random.Random(28)
    users = list(get_user_model().objects.values_list("pk", flat=True))
    now = timezone.now()
    start = ApiToken.objects.count()
    for first in range(0, count, 5000):
        rows = []
        for n in range(start + first, start + min(count, first + 5000)):
            digest = hashlib.sha256(f"bench-key-{n}".encode()).hexdigest()
            kind = rng.random()
            scopes = ["read"] if kind < 0.2 else ["read", "write", "approvals", "admin"] if kind > 0.99 else None
            rows.append(
                ApiToken(
                    user_id=rng.choice(users),
                    name=f"bench {n}",
                    prefix=f"agt_{digest[:8]}",
                    token_hash=digest,
                    scopes=scopes or ["read", "write", "approvals"],
                    last_used_at=now if rng.random() < 0.7 else None,
                    revoked_at=now if rng.random() < 0.1 else None,
                )
            )
        ApiToken.objects.bulk_create(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--db", default=None, help="SQLite file to create (overwritten)")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL database to seed once and keep")
    parser.add_argument("--keys", type=int, default=0, help="API keys to add and measure the keys admin with")
    parser.add_argument("--mutate", action="store_true", help="also run recover_runs and prune (changes data)")
    parser.add_argument("--repeat", type=int, default=5, help="requests per page (median reported)")
    parser.add_argument("--json", dest="json_out", default=None)
    parser.add_argument("--keep", action="store_true", help="reuse an existing seeded --db instead of seeding")
    args = parser.parse_args()

    if bool(args.db) == bool(args.database_url):
        parser.error("give exactly one of --db and --database-url")
    if args.db:
        db = Path(args.db)
        if not args.keep:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{db}"
        mutate = True
    else:
        os.environ["DATABASE_URL"] = args.database_url
        mutate = args.mutate
    os.environ["DJANGO_SETTINGS_MODULE"] = "gatewayproject.settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from sessions_app import operator_reads
    from sessions_app.models import ApiToken, ChatSession, Run
    from sessions_app.operations import doctor, prune

    results: dict[str, Any] = {"sessions": args.sessions, "runs": args.runs}

    def report(name: str, **values: Any) -> None:
        results[name] = values
        print(f"{name:42} " + "  ".join(f"{k}={v}" for k, v in values.items()), flush=True)

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    report("migrate", seconds=round(time.perf_counter() - started, 1))
    postgres = connection.vendor == "postgresql"
    if not args.keep and not (postgres and ChatSession.objects.exists()):
        started = time.perf_counter()
        call_command(
            "seed_demo_data",
            sessions=args.sessions,
            runs=args.runs,
            progress="never",
            transcripts=postgres,
            stdout=io.StringIO(),
        )
        seconds = time.perf_counter() - started
        report("seed_demo_data", seconds=round(seconds, 1), runs_per_s=int(args.runs / seconds) if seconds else 0)
        if postgres:
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE")
    if args.keys and ApiToken.objects.count() < args.keys:
        started = time.perf_counter()
        seed_keys(args.keys - ApiToken.objects.count())
        report("seed keys", seconds=round(time.perf_counter() - started, 1))
        if postgres:
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE sessions_app_apitoken")
    report("rows", sessions=ChatSession.objects.count(), runs=Run.objects.count())
    if args.keys:
        report("key rows", keys=ApiToken.objects.count())

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
    middle = ChatSession.objects.order_by("pk")[args.sessions // 2 : args.sessions // 2 + 1].first()
    assert session is not None and run is not None and middle is not None
    sessions_url, runs_url = "/admin/sessions_app/chatsession/", "/admin/sessions_app/run/"
    pages = {
        "changelist": sessions_url,
        "changelist ?stuck=yes": f"{sessions_url}?stuck=yes",
        "changelist ?failed=24h": f"{sessions_url}?failed=24h",
        "changelist ?status=failed": f"{sessions_url}?status=failed",
        "changelist deep page": f"{sessions_url}?p={max(1, min(1000, args.sessions // 50))}",
        "changelist sort by last run": f"{sessions_url}?o=-5",
        "changelist search exact key": f"{sessions_url}?q={middle.key}",
        "changelist search runId": f"{sessions_url}?q={run.run_id}",
        "changelist search owner": f"{sessions_url}?q=seed-user-7",
        "session detail": f"{sessions_url}{session.pk}/change/",
        "run changelist": runs_url,
        "run changelist ?error_kind=backend": f"{runs_url}?error_kind=backend",
        "run changelist ?error_kind=timeout": f"{runs_url}?error_kind=timeout",
        "run changelist sort by created": f"{runs_url}?o=-6",
        "run changelist search": f"{runs_url}?q={run.run_id}",
        "run detail": f"{runs_url}{run.pk}/change/",
    }
    if args.keys:
        keys_url = "/admin/sessions_app/apitoken/"
        key = ApiToken.objects.order_by("pk")[args.keys // 2 : args.keys // 2 + 1].get()
        pages.update(
            {
                "key changelist": keys_url,
                "key changelist ?state=active": f"{keys_url}?state=active",
                "key changelist ?state=revoked": f"{keys_url}?state=revoked",
                "key changelist ?scope=admin": f"{keys_url}?scope=admin",
                "key changelist ?scope=read-only": f"{keys_url}?scope=read-only",
                "key changelist deep page": f"{keys_url}?p={max(1, min(1000, args.keys // 50))}",
                "key changelist search prefix": f"{keys_url}?q={key.prefix}",
                "key changelist search user": f"{keys_url}?q=seed-user-7",
                "key detail": f"{keys_url}{key.pk}/change/",
            }
        )

    def full_scan(step: str) -> bool:
        if postgres:
            return any(f"Seq Scan on sessions_app_{table}" in step for table in ("run", "chatsession", "apitoken"))
        return step.startswith("SCAN") and "USING" not in step

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
        extra: dict[str, Any] = {}
        if postgres:
            # every SELECT the page ran, explained: no sequential scan of runs or sessions
            scans = []
            with connection.cursor() as cursor:
                for query in captured.captured_queries:
                    if query["sql"].lstrip().upper().startswith("SELECT"):
                        cursor.execute("EXPLAIN " + query["sql"])
                        scans += [row[0].strip() for row in cursor.fetchall() if full_scan(row[0])]
            extra = {"seq_scans": len(scans)}
        report(f"admin {name}", queries=queries, median_ms=round(statistics.median(timings), 1), **extra)

    def plan(qs: Any) -> list[str]:
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cursor:
            if postgres:
                cursor.execute("EXPLAIN " + sql, params)
                return [row[0].strip() for row in cursor.fetchall()]
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return [row[-1] for row in cursor.fetchall()]

    for name, qs in {
        "stuck filter": operator_reads.stuck_sessions(),
        "failed 24h filter": operator_reads.failed_sessions(),
        "running": operator_reads.running_sessions(),
    }.items():
        steps = plan(qs)
        scans = [s for s in steps if full_scan(s)]
        started = time.perf_counter()
        count = qs.count()
        report(
            f"plan {name}",
            rows=count,
            ms=round((time.perf_counter() - started) * 1000, 1),
            full_scans=len(scans),
            plan=" | ".join(steps),
        )

    started = time.perf_counter()
    findings = doctor.check()
    report("gateway_doctor check", findings=len(findings), ms=round((time.perf_counter() - started) * 1000, 1))
    started = time.perf_counter()
    response = client.get("/metrics")
    report("/metrics scrape", status=response.status_code, ms=round((time.perf_counter() - started) * 1000, 1))

    if not mutate:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2))
        return
    started = time.perf_counter()
    call_command("recover_runs", stdout=io.StringIO())
    report(
        "recover_runs",
        ms=round((time.perf_counter() - started) * 1000, 1),
        stuck_after=operator_reads.stuck_sessions().count(),
    )

    candidates = prune.count_candidates(60)
    started = time.perf_counter()
    pruned = prune.prune_sessions(older_than_days=60)
    seconds = time.perf_counter() - started
    report(
        "prune_sessions --older-than-days 60",
        sessions=pruned.sessions,
        runs=pruned.runs,
        candidates=candidates,
        seconds=round(seconds, 1),
        sessions_per_s=int(pruned.sessions / seconds) if seconds else 0,
    )

    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
