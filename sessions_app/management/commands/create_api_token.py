"""Issue an API key for a user; the raw key is printed once, on the last line."""

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from sessions_app.management.opscommand import OpsCommand
from sessions_app.tokens import READ_ONLY, SCOPE_ORDER, KeyRefused, get_or_create_user, issue_token


class Command(OpsCommand):
    help = "Create an API key for USER and print it (shown only once; only its hash is stored)."
    supports_dry_run = False

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("username")
        parser.add_argument("--create-user", action="store_true", help="create the user if missing")
        parser.add_argument("--name", default="", help="a label for the key")
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--scopes",
            help=f"comma-separated, of {','.join(SCOPE_ORDER)} (default read,write,approvals; "
            "read is required; admin only for a staff user)",
        )
        which.add_argument("--read-only", action="store_true", help="the read scope alone (same as --scopes read)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        scopes: list[str] | None = None
        if options["read_only"]:
            scopes = list(READ_ONLY)
        elif options["scopes"] is not None:
            scopes = [s for s in options["scopes"].split(",") if s.strip()]
        try:
            with transaction.atomic():  # a refused key leaves no user made for it either
                user = get_or_create_user(options["username"], create=options["create_user"])
                if user is None:
                    raise CommandError(f"no user {options['username']!r} (use --create-user)")
                token, raw = issue_token(user, name=options["name"], scopes=scopes)
        except KeyRefused as exc:
            raise CommandError(f"no key made: {exc.message}") from exc
        if self.as_json:
            self.emit_json(
                {
                    "id": token.pk,
                    "user": user.get_username(),
                    "name": token.name,
                    "prefix": token.prefix,
                    "scopes": token.scopes,
                    "token": raw,
                }
            )
            return
        scope_text = ",".join(token.scopes)
        self.stdout.write(f"Key {token.prefix}… for {user} with scopes {scope_text} (store it now; not shown again):")
        self.stdout.write(raw)
