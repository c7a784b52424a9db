"""Issue an API token for a user; the raw token is printed once, on the last line."""

from typing import Any

from django.core.management.base import CommandError, CommandParser

from sessions_app.management.opscommand import OpsCommand
from sessions_app.tokens import get_or_create_user, issue_token


class Command(OpsCommand):
    help = "Create an API token for USER and print it (shown only once; only its hash is stored)."
    supports_dry_run = False

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("username")
        parser.add_argument("--create-user", action="store_true", help="create the user if missing")
        parser.add_argument("--name", default="", help="a label for the token")

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        user = get_or_create_user(options["username"], create=options["create_user"])
        if user is None:
            raise CommandError(f"no user {options['username']!r} (use --create-user)")
        token, raw = issue_token(user, name=options["name"])
        if self.as_json:
            self.emit_json(
                {"id": token.pk, "user": user.get_username(), "name": token.name, "prefix": token.prefix, "token": raw}
            )
            return
        self.stdout.write(f"Token {token.prefix}… for {user} (store it now; it is not shown again):")
        self.stdout.write(raw)
