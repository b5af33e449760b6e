from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from controlplane.tenants.models import ApiKey, Tenant


class Command(BaseCommand):
    help = "Create a tenant and print its first API key (alone, on the last line)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="lowercase letters, digits and '-'")
        parser.add_argument("--display-name", default="", help="the name people read (optional)")

    def handle(self, name: str, display_name: str, **options: Any) -> None:
        tenant = Tenant(name=name, display_name=display_name)
        try:
            tenant.full_clean()
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)} (got {name!r})" for k, v in exc.message_dict.items())
            ) from None
        with transaction.atomic():
            tenant.save()
            _, secret = ApiKey.issue(name=f"{name}-initial", tenant=tenant)
        self.stderr.write(f"Created tenant {name!r}. Its API key is shown once, below:")
        self.stdout.write(secret)
