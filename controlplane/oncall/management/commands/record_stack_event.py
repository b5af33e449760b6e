"""`manage.py record_stack_event`: a death of one of the embedded stack's processes, on on-call."""

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.oncall import stack
from controlplane.oncall.models import Event, Kind, Severity

NAME_MAX = 40
TAIL_MAX_LINES = 50


class Command(BaseCommand):
    help = (
        "Record that a process of the embedded stack (`make run`) died and is started again: an "
        "on-call event with the end of its log (read from standard input). The stack's supervisor "
        "runs it; it writes to the database directly, so it works while the control plane is down."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("process", help="the process as the stack names it, e.g. 'celery' or 'router'")
        parser.add_argument("--exit-code", type=int, required=True, help="its exit status (-N: signal N)")
        parser.add_argument("--ran-s", type=float, required=True, help="seconds it ran before it died")
        parser.add_argument("--restart-in-s", type=float, required=True, help="the wait before its restart")
        parser.add_argument("--restarts", type=int, required=True, help="restarts so far, this one included")
        parser.add_argument("--log", default="", help="its log file")
        parser.add_argument("--crash-loop", action="store_true", help="it keeps dying at once (critical)")

    def handle(self, process: str, **options: Any) -> None:
        if not process.strip() or len(process) > NAME_MAX:
            raise CommandError(f"process must be 1-{NAME_MAX} characters, got {process!r}")
        tail = self.stdin_lines()
        code = options["exit_code"]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        event = Event.record(
            Kind.CRASH_LOOP if options["crash_loop"] else Kind.RESTART,
            f"{process} of the embedded stack {how} after {options['ran_s']:.0f} s; "
            f"started again after {options['restart_in_s']:.0f} s",
            severity=Severity.CRITICAL if options["crash_loop"] else Severity.WARNING,
            pod=stack.pod_of(process),
            reported_by=stack.REPORTER,
            detail={
                "process": process,
                "exit_code": code,
                "ran_s": options["ran_s"],
                "restart_in_s": options["restart_in_s"],
                "restarts": options["restarts"],
                "log": options["log"],
                "log_tail": tail,
            },
        )
        self.stdout.write(f"recorded event {event.pk}")

    def stdin_lines(self) -> list[str]:
        if sys.stdin is None or sys.stdin.isatty():
            return []
        return sys.stdin.read().splitlines()[-TAIL_MAX_LINES:]
