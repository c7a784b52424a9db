"""Revoke API tokens by id, printed prefix or user."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser

from sessions_app.management.opscommand import OpsCommand
from sessions_app.models import ApiToken
from sessions_app.tokens import revoke_token


class Command(OpsCommand):
    help = "Revoke API tokens: one by --id or --prefix, or every token of --user."
    dry_run_help = "list the tokens that would be revoked; revoke nothing"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", type=int, dest="token_id", help="the token's id")
        which.add_argument("--prefix", help="the token's printed prefix, e.g. agt_AbC12345")
        which.add_argument("--user", help="revoke every active token of this user")

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        tokens = ApiToken.objects.filter(revoked_at__isnull=True).select_related("user").order_by("pk")
        if options["token_id"] is not None:
            tokens = tokens.filter(pk=options["token_id"])
        elif options["prefix"]:
            if len(options["prefix"]) < 6:
                raise CommandError("--prefix needs at least 6 characters")
            tokens = tokens.filter(prefix__startswith=options["prefix"])
        else:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"no user {options['user']!r}")
            tokens = tokens.filter(user=user)
        found = list(tokens)
        revoked = 0
        if not self.dry_run:
            for token in found:
                revoked += revoke_token(token_id=token.pk)
        rows = [{"id": t.pk, "prefix": t.prefix, "user": t.user.get_username(), "name": t.name} for t in found]
        if self.as_json:
            self.emit_json({"dryRun": self.dry_run, "tokens": rows, "revoked": revoked})
            return
        if not found:
            self.line("No active token matches.", self.style.WARNING)
            return
        for row in rows:
            self.line(f"  {row['prefix']}… (id {row['id']}) of {row['user']} {row['name']}".rstrip())
        if self.dry_run:
            self.line(f"Dry run: {len(found)} token(s) would be revoked.", self.style.WARNING)
        else:
            self.line(
                f"Revoked {revoked} token(s). Open connections using them are closed (4008) at once "
                "(through the channel layer; at the latest at their next tick, GATEWAY_TICK_INTERVAL_MS).",
                self.style.SUCCESS,
            )
