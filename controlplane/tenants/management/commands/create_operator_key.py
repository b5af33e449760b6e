from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.tenants.models import ApiKey


class Command(BaseCommand):
    help = "Create an operator API key (sees and sells for every tenant); prints it on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who or what holds the key, e.g. 'alice' or 'prober'")

    def handle(self, name: str, **options: Any) -> None:
        if not name.strip() or len(name) > 100:
            raise CommandError(f"name must be 1-100 characters, got {name!r}")
        _, secret = ApiKey.issue(name=name, tenant=None)
        self.stderr.write(f"Created operator key {name!r}. It is shown once, below:")
        self.stdout.write(secret)
