"""Create the demo login on first start (idempotent) and say how to log in."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the demo user (demo / demo-password) if there is no user yet, and print the login."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo-password")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        username, password = options["username"], options["password"]
        if not User.objects.filter(username=username).exists():
            if User.objects.exists():
                self.stdout.write("Users exist already; create more with `python manage.py createsuperuser`.")
                return
            User.objects.create_superuser(username=username, password=password, email="")
            self.stdout.write(f"Created the demo user: log in as {username!r} with password {password!r}.")
        else:
            self.stdout.write(f"Log in as {username!r} (demo password {password!r} unless you changed it).")
        self.stdout.write("API clients: `python manage.py create_api_token USER` prints a token.")
