"""Create a console user. The password never comes on the command line, where every user of the
machine can read it (ps, /proc/<pid>/cmdline): it is read from standard input with
``--password-stdin``, else from ``$CONTROLPLANE_USER_PASSWORD``, else from standard input when that
is not a terminal, else asked for twice at the terminal. ``--password VALUE`` is refused, saying so."""

import getpass
import os
import sys
from typing import IO, Any

from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from controlplane.tenants.models import Member, Tenant
from dataplane.keys import refused

PASSWORD_VARIABLE = "CONTROLPLANE_USER_PASSWORD"
ON_ARGV = (
    "--password puts the password on the command line, where every user of the machine can read it"
    f" (ps); pipe it on standard input (--password-stdin) or set ${PASSWORD_VARIABLE}"
)


def read_password(stdin: IO[str], from_stdin: bool) -> str:
    """The password: standard input's first line when asked (--password-stdin), else
    $CONTROLPLANE_USER_PASSWORD, else standard input when it is a pipe, else asked at the terminal."""
    if from_stdin:
        return stdin.readline().rstrip("\r\n")
    if PASSWORD_VARIABLE in os.environ:  # before a pipe: a script's stdin may be /dev/null
        return os.environ[PASSWORD_VARIABLE]
    if not stdin.isatty():
        return stdin.readline().rstrip("\r\n")
    first = getpass.getpass("Password: ")
    if first != getpass.getpass("Password (again): "):
        raise CommandError("the two passwords differ")
    return first


class Command(BaseCommand):
    help = (
        "Create a console user who belongs to a tenant (--tenant NAME) or is an operator (--operator);"
        f" the password from standard input or ${PASSWORD_VARIABLE}, never the command line."
    )
    stealth_options = ("stdin",)  # call_command(..., stdin=StringIO("...\n")) in tests

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", help="the name the user signs in with")
        parser.add_argument("--password", action=refused(ON_ARGV), help=f"refused: {ON_ARGV}")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="read the password from standard input's first line (also when it is not a terminal)",
        )
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--tenant", help="the tenant the user belongs to")
        who.add_argument("--operator", action="store_true", help="platform staff: sees every tenant")

    def handle(
        self, username: str, tenant: str | None, operator: bool, password_stdin: bool, **options: Any
    ) -> None:
        stdin = options.get("stdin") or sys.stdin
        password = read_password(stdin, password_stdin)
        if not password:
            raise CommandError(
                f"no password: pipe it on standard input (--password-stdin) or set ${PASSWORD_VARIABLE}"
            )
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
