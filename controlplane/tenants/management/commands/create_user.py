from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from controlplane.tenants.models import Member, Tenant


class Command(BaseCommand):
    help = "Create a console user who belongs to a tenant (--tenant NAME) or is an operator (--operator)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--tenant", help="the tenant the user belongs to")
        who.add_argument("--operator", action="store_true", help="platform staff: sees every tenant")

    def handle(
        self, username: str, password: str, tenant: str | None, operator: bool, **options: Any
    ) -> None:
        if User.objects.filter(username=username).exists():
            raise CommandError(f"user {username!r} already exists")
        found = None
        if tenant is not None:
            found = Tenant.objects.filter(name=tenant).first()
            if found is None:
                raise CommandError(f"unknown tenant {tenant!r}")
        user = User(username=username)
        try:
            user.full_clean(exclude=["password"])
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from None
        try:  # settings.AUTH_PASSWORD_VALIDATORS
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(f"password refused: {' '.join(exc.messages)}") from None
        with transaction.atomic():
            user.set_password(password)
            user.save()
            Member.objects.create(user=user, tenant=found, is_operator=operator)
        self.stdout.write(f"Created {'operator' if operator else f'member of {tenant}'} {username!r}.")
