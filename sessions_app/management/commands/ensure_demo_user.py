"""Create the demo login on first start (idempotent) and say how to log in."""

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = (
        "Create the demo user (a plain user, not staff) with a random password, printed once, if there is no user yet."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default=None, help="use this password instead of a random one")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        username = options["username"]
        if User.objects.filter(username=username).exists():
            self.stdout.write(
                f"Log in as {username!r} with the password printed when it was created "
                f"(set another with `python manage.py changepassword {username}`)."
            )
        elif User.objects.exists():
            self.stdout.write("Users exist already; create more with `python manage.py createsuperuser`.")
            return
        else:
            # Never a published password, never a superuser: `HOST=0.0.0.0 make run` must not hand
            # out an admin account. The password is shown this once and stored only hashed.
            password = options["password"] or secrets.token_urlsafe(12)
            User.objects.create_user(username=username, password=password, email="")
            self.stdout.write(
                f"Created the demo user: log in as {username!r} with password {password!r} (shown only now)."
            )
        self.stdout.write("API clients: `python manage.py create_api_token USER` prints a token.")
