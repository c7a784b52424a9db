"""Set-up for the load client: many users with one API token each, and one long session.

Run in its own process against the gateway's database (DATABASE_URL from the
environment), before anything is measured; prints one JSON object on stdout:
`{"tokens": {username: raw_token}, "long_session": key}`. Users and tokens are
bulk-inserted, so a thousand take well under a second; the long session's
transcript is bulk-inserted too (ORM `bulk_create` of `Message` rows of the
session's current generation, as `chat.send` would have left them).

    DATABASE_URL=sqlite:///db.sqlite3 .venv/bin/python bench/seed.py --users 1000 --long-messages 10000
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1000, help="users bench0..benchN-1, one token each")
    parser.add_argument("--extra", nargs="*", default=["benchfan", "benchlong"], help="more users by name")
    parser.add_argument("--long-messages", type=int, default=10_000)
    parser.add_argument("--long-user", default="benchlong")
    parser.add_argument("--long-key", default="agent:main:long")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewayproject.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.db import transaction

    from sessions_app.models import ApiToken, ChatSession, Message
    from sessions_app.tokens import TOKEN_PREFIX, hash_token

    user_model = get_user_model()
    names = [f"{PREFIX}{i}" for i in range(args.users)] + list(args.extra)
    unusable = make_password(None)
    tokens: dict[str, str] = {}
    with transaction.atomic():
        existing = set(user_model.objects.filter(username__in=names).values_list("username", flat=True))
        user_model.objects.bulk_create(
            [user_model(username=n, password=unusable) for n in names if n not in existing], batch_size=500
        )
        ids = dict(user_model.objects.filter(username__in=names).values_list("username", "pk"))
        rows = []
        for name in names:
            raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
            tokens[name] = raw
            rows.append(ApiToken(user_id=ids[name], name="bench", prefix=raw[:12], token_hash=hash_token(raw)))
        ApiToken.objects.bulk_create(rows, batch_size=500)
        if args.long_messages > 0:
            session, _ = ChatSession.objects.get_or_create(owner_id=ids[args.long_user], key=args.long_key)
            Message.objects.bulk_create(
                [
                    Message(
                        session=session,
                        session_generation=session.session_id,
                        role="user" if i % 2 == 0 else "assistant",
                        text=f"seeded message {i} " + "lorem ipsum " * 8,
                    )
                    for i in range(args.long_messages)
                ],
                batch_size=1000,
            )
    print(json.dumps({"tokens": tokens, "long_session": args.long_key}))


if __name__ == "__main__":
    main()
