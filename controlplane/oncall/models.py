"""Events: everything on-call needs to see, written by probers, the autoscaler and benchmarks.

Events outlive their endpoint (the link is nulled, the name kept in `endpoint_name`), and their
id is the tail cursor. Ids are handed out at insert but become visible at commit, so a reader
that has seen id 11 may not yet see id 10, still in an open transaction. The tail therefore only
hands out events recorded at least SETTLE ago (`EventQuerySet.tail`): past that, every lower id
is committed or rolled back, and "after id N" never misses nor repeats one. Events are written
in short transactions for that reason.

Repeats of one problem fold into an `EventGroup` (controlplane.oncall.grouping says what one
problem is): on-call acknowledges, silences and resolves groups, and groups are what pages
(controlplane.oncall.paging). A group is open until it is resolved, by an operator or by
`resolve_quiet` after ONCALL_RESOLVE_AFTER_S without a repeat; the next repeat after that opens a
new group, which pages again. At most one unresolved group per fingerprint (a constraint).
"""

import functools
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, models, transaction
from django.db.models import F
from django.db.models.lookups import In
from django.utils import timezone

from controlplane.oncall import grouping, stack
from controlplane.tenants.models import Principal, Tenant, TenantScopedQuerySet

if TYPE_CHECKING:  # for the annotation only: on-call's models load without the endpoints app's
    from controlplane.endpoints.models import Endpoint

SETTLE = timedelta(seconds=1)
SILENCE_REASON_MAX = 300


def may_acknowledge(principal: Principal) -> bool:
    """Who may acknowledge an event: operators only. Acknowledging tells on-call an event is
    handled and takes it off the operators' unacknowledged panel; every event is written by the
    system or by an operator's key (tenants cannot write events), so none is a tenant's to clear.
    Tenants still see who acknowledged their events, and when. The API and the console ask here."""
    return principal.is_operator


class EventQuerySet(TenantScopedQuerySet["Event"]):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list["Event"]:
        """The autoscaler writes its pass's events at once: each is counted into its group first."""
        events = list(objs)
        with transaction.atomic():
            for event in events:
                if event.group_id is None:
                    event.group = EventGroup.fold(event)
            return super().bulk_create(events, *args, **kwargs)

    def tail(self, after: int, now: datetime) -> "EventQuerySet":
        """Events after the cursor `after` that can no longer be overtaken: a condition on this
        queryset, not a subquery, so that newest first under any filter reads only the page."""
        return self.filter(id__gt=after, recorded_at__lte=now - SETTLE)

    def settled_cursor(self, now: datetime) -> int:
        """The cursor to start a tail from: the newest id that can no longer be overtaken."""
        newest = (
            self.filter(recorded_at__lte=now - SETTLE).order_by("-id").values_list("id", flat=True).first()
        )
        return newest or 0


class Kind(models.TextChoices):
    HANG = "hang"
    RESTART = "restart"
    CRASH_LOOP = "crash_loop"
    SCALE = "scale"
    CONCURRENCY = "concurrency"
    ROLLOUT = "rollout"
    BENCHMARK = "benchmark"
    RESERVATION = "reservation"
    ENDPOINT = "endpoint"


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


# On-call's order of groups: open first, then acknowledged, then resolved; within each, critical
# before warning before info. Expressions, so that an index on them (EventGroup.Meta) hands the
# page its rows in order: the same expressions in the index and in the query.
STATE_RANKS = {"open": 0, "acknowledged": 1, "resolved": 2}


def state_rank() -> models.Case:
    return models.Case(
        models.When(state="open", then=0), models.When(state="acknowledged", then=1), default=2
    )


def severity_rank() -> models.Case:
    return models.Case(
        models.When(severity="critical", then=0), models.When(severity="warning", then=1), default=2
    )


def on_call_keys() -> tuple[models.Case, models.Case, models.OrderBy, models.OrderBy]:
    """EventGroupQuerySet.on_call_order's keys, for its indexes."""
    return state_rank(), severity_rank(), F("last_at").desc(), F("id").desc()


class EventGroupQuerySet(TenantScopedQuerySet["EventGroup"]):
    def unresolved(self) -> "EventGroupQuerySet":
        return self.exclude(state=EventGroup.State.RESOLVED)

    def on_call_order(self) -> "EventGroupQuerySet":
        """Open first (critical before warning, newest first), then acknowledged, then resolved."""
        return self.annotate(state_rank=state_rank(), severity_rank=severity_rank()).order_by(
            "state_rank", "severity_rank", "-last_at", "-id"
        )

    def in_states(self, states: list[str]) -> "EventGroupQuerySet":
        """Of these states, as a condition on the order's first key: an index scan in on-call
        order reads only their rows."""
        return self.filter(In(state_rank(), sorted({STATE_RANKS[s] for s in states})))


class EventGroup(models.Model):
    """Repeats of one problem: its count, first and last time, and what on-call did about it."""

    class State(models.TextChoices):
        OPEN = "open"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"

    fingerprint = models.CharField(max_length=64)  # grouping.fingerprint
    kind = models.CharField(max_length=16, choices=Kind.choices)
    severity = models.CharField(max_length=8, choices=Severity.choices)  # the worst seen
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="event_groups"
    )
    endpoint = models.ForeignKey(
        "endpoints.Endpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="event_groups"
    )
    endpoint_name = models.CharField(max_length=63, blank=True)
    pod = models.CharField(max_length=253, blank=True)  # the latest event's
    pattern = models.CharField(max_length=grouping.PATTERN_MAX)  # the normalised message
    message = models.TextField()  # the latest event's
    count = models.PositiveIntegerField(default=1)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)
    silenced_until = models.DateTimeField(null=True, blank=True)
    silenced_by = models.CharField(max_length=150, blank=True)
    silence_reason = models.CharField(max_length=SILENCE_REASON_MAX, blank=True)
    # Paging (controlplane.oncall.paging): what the webhook was last told ("", firing, resolved),
    # whether it must be told something now, and the retries of a delivery that failed.
    paged = models.CharField(max_length=8, blank=True)
    page_due = models.BooleanField(default=False)
    page_attempts = models.PositiveSmallIntegerField(default=0)
    page_retry_at = models.DateTimeField(null=True, blank=True)
    page_error = models.CharField(max_length=300, blank=True)

    objects = EventGroupQuerySet.as_manager()

    class Meta:
        ordering = ["-last_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"], condition=~models.Q(state="resolved"), name="one_unresolved_group"
            )
        ]
        indexes = [
            models.Index(fields=["state", "-last_at"]),
            # On-call's pages of groups (EventGroupQuerySet.on_call_order), the fleet's and a tenant's.
            models.Index(*on_call_keys(), name="oncall_group_on_call"),
            models.Index(F("tenant"), *on_call_keys(), name="oncall_group_tenant_on_call"),
            # The groups resolved in the last day, which the page shows below the unresolved.
            models.Index(
                fields=["resolved_at"], name="oncall_group_resolved_at", condition=models.Q(state="resolved")
            ),
            models.Index(
                fields=["page_due"], name="oncall_group_page_due", condition=models.Q(page_due=True)
            ),
        ]

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind} x{self.count}: {self.pattern}"

    def silenced(self, now: datetime) -> bool:
        return self.silenced_until is not None and self.silenced_until > now

    def pages(self) -> bool:
        """Whether this group goes to the webhook: criticals, and warnings when ONCALL_PAGE_WARNINGS."""
        return self.severity == Severity.CRITICAL or (
            self.severity == Severity.WARNING and settings.ONCALL_PAGE_WARNINGS
        )

    @classmethod
    def fold(cls, event: "Event") -> "EventGroup":
        """Count `event` into the unresolved group of its problem, or open one. Run inside the
        event's transaction (both writers of events open one): the group row is locked
        (PostgreSQL) while it is counted. An info event into an info group is counted by the
        same rules in SQL (Event._fold_and_insert)."""
        opened = cls.opened_by(event)
        fp = opened.fingerprint
        group = cls.objects.select_for_update().filter(fingerprint=fp).unresolved().first()
        if group is None:
            try:
                with transaction.atomic():  # a savepoint: a concurrent first repeat wins the race
                    opened.save(force_insert=True)
                    opened._page_if_due(timezone.now())
                    return opened
            except IntegrityError:
                group = cls.objects.select_for_update().filter(fingerprint=fp).unresolved().get()
        group.count += 1
        group.first_at = min(group.first_at, event.time)
        if event.time >= group.last_at:
            group.last_at, group.message, group.pod = event.time, event.message, event.pod
        worst = grouping.worse(group.severity, event.severity)
        rose = worst != group.severity
        if rose:  # worse than what was acknowledged or silenced: on-call must look again
            was = group.severity
            group.severity, group.state = worst, cls.State.OPEN
            if group.silenced_until is not None:
                # A silence was meant for the milder problem: it ends, and the row says why.
                group.silenced_until = None
                note = f"lifted when it rose from {was} to {worst}; was: {group.silence_reason}"
                group.silence_reason = note[:SILENCE_REASON_MAX]
        group._page_if_due(timezone.now(), save=False, escalated=rose)
        group.save()
        return group

    @classmethod
    def opened_by(cls, event: "Event") -> "EventGroup":
        """The group `event` opens when its problem has none unresolved (not saved)."""
        pattern = grouping.normalise(event.message)
        subject = grouping.subject(event.endpoint_id, event.endpoint_name, event.pod)
        return cls(
            fingerprint=grouping.fingerprint(event.kind, event.tenant_id, subject, pattern),
            kind=event.kind,
            severity=event.severity,
            tenant_id=event.tenant_id,
            endpoint_id=event.endpoint_id,
            endpoint_name=event.endpoint_name,
            pod=event.pod,
            pattern=pattern,
            message=event.message,
            first_at=event.time,
            last_at=event.time,
        )

    def _page_if_due(self, now: datetime, save: bool = True, escalated: bool = False) -> None:
        """Mark for the webhook when it pages and has not fired yet, or has fired at a milder
        severity (`escalated`: the new page carries the new severity label, as Alertmanager
        re-sends on a label change). Paging sends it after commit."""
        if (
            (self.paged != "firing" or escalated)
            and self.state != self.State.RESOLVED
            and self.pages()
            and not self.silenced(now)
        ):
            self.page_due = True
            if save:
                EventGroup.objects.filter(pk=self.pk).update(page_due=True)
            from controlplane.oncall import paging

            paging.deliver_after_commit()

    def acknowledge(self, by: str, now: datetime) -> bool:
        """The first acknowledgement stands; the group's unacknowledged events are acknowledged too."""
        claimed = EventGroup.objects.filter(pk=self.pk, state=self.State.OPEN).update(
            state=self.State.ACKNOWLEDGED, acknowledged_at=now, acknowledged_by=by
        )
        Event.objects.filter(group_id=self.pk, acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=by
        )
        self.refresh_from_db()
        return claimed == 1

    def resolve(self, by: str, now: datetime) -> bool:
        """Closed: the next repeat opens a new group. Tells the webhook when it had fired."""
        with transaction.atomic():
            group = EventGroup.objects.select_for_update().filter(pk=self.pk).unresolved().first()
            if group is not None:
                group.state, group.resolved_at, group.resolved_by = self.State.RESOLVED, now, by
                group.page_due = group.paged == "firing"  # a page that fired must be told it cleared
                group.page_attempts, group.page_retry_at = 0, None
                group.save()
                if group.page_due:
                    from controlplane.oncall import paging

                    paging.deliver_after_commit()
        self.refresh_from_db()
        return group is not None

    def silence(self, by: str, until: datetime, reason: str) -> None:
        """No page until `until`; the group stays on the page, marked silenced, with who and why."""
        EventGroup.objects.filter(pk=self.pk).update(
            silenced_until=until, silenced_by=by, silence_reason=reason
        )
        self.refresh_from_db()

    @classmethod
    def resolve_quiet(cls, now: datetime) -> int:
        """Resolve the groups with no repeat for ONCALL_RESOLVE_AFTER_S: the problem cleared."""
        quiet = now - timedelta(seconds=settings.ONCALL_RESOLVE_AFTER_S)
        resolved = 0
        for group in cls.objects.unresolved().filter(last_at__lt=quiet).only("pk"):
            resolved += group.resolve("auto: no repeat", now)
        return resolved


class Event(models.Model):
    Kind = Kind
    Severity = Severity

    kind = models.CharField(max_length=16, choices=Kind.choices)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.INFO)
    # No index of their own: (tenant, -id) and (endpoint, -id) below lead with them.
    tenant = models.ForeignKey(
        "tenants.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="events",
        db_index=False,
    )
    endpoint = models.ForeignKey(
        "endpoints.Endpoint",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="events",
        db_index=False,
    )
    endpoint_name = models.CharField(max_length=63, blank=True)
    pod = models.CharField(max_length=253, blank=True)
    version = models.PositiveIntegerField(null=True, blank=True)  # the endpoint version the pod ran
    group = models.ForeignKey(
        EventGroup,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="events",
        db_index=False,  # (group, time) below leads with it
    )
    message = models.TextField()
    detail = models.JSONField(default=dict, blank=True)
    # When it happened (the reporter's clock); `id` orders arrival.
    time = models.DateTimeField(default=timezone.now)
    # When this server stored it; the tail's settle rule reads it (see the module docstring).
    recorded_at = models.DateTimeField(default=timezone.now, editable=False)
    reported_by = models.CharField(max_length=100, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)

    objects = EventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "-id"]),
            models.Index(fields=["endpoint", "-id"]),
            models.Index(fields=["severity", "-id"]),
            models.Index(fields=["kind", "-id"]),
            models.Index(fields=["time"]),
            # The on-call attention panel: crash loops, repeated hangs, restarts per pod by kind
            # and recency; unacknowledged criticals of the last day.
            models.Index(fields=["kind", "time"]),
            models.Index(
                fields=["time"],
                name="oncall_unacked_critical",
                condition=models.Q(severity="critical", acknowledged_at__isnull=True),
            ),
            # A tenant's attention panels: its newest events of a kind.
            models.Index(fields=["tenant", "kind", "time"], name="oncall_event_tenant_kind_time"),
            # The lists' filters, newest first: a pod's events (on-call's ?pod=, the endpoint
            # page's pods), the acknowledged ones (few), and a group's by hour (its sparkline).
            models.Index(fields=["pod", "-id"], name="oncall_event_pod_newest"),
            models.Index(
                fields=["-id"],
                name="oncall_event_acknowledged",
                condition=models.Q(acknowledged_at__isnull=False),
            ),
            models.Index(fields=["group", "time"], name="oncall_event_group_time"),
            # The embedded stack's own deaths (its attention panel): a handful among the fleet's
            # events, which (kind, time) would read a day of to find them.
            models.Index(
                fields=["-time", "-id"],
                name="oncall_event_stack_newest",
                condition=models.Q(reported_by=stack.REPORTER),
            ),
        ]

    def __str__(self) -> str:
        return f"[{self.severity}] {self.kind}: {self.message}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A new event is counted into its group in the same transaction (every writer's path)."""
        if self._state.adding and self.group_id is None:
            # objects.create saves with force_insert and its database (the only one).
            plain = not args and set(kwargs) <= {"force_insert", "using"}
            default_db = kwargs.get("using", DEFAULT_DB_ALIAS) == DEFAULT_DB_ALIAS
            if plain and default_db and self._fold_and_insert():
                return
            with transaction.atomic():
                self.group = EventGroup.fold(self)
                super().save(*args, **kwargs)
            return
        super().save(*args, **kwargs)

    def _fold_and_insert(self) -> bool:
        """EventGroup.fold and the insert in one statement, on PostgreSQL, for an info event whose
        group is info too (or new): such a fold only counts (it cannot raise the group's
        severity, and an info group never pages), so its rules here are fold's counting alone,
        and tests/oncall/test_groups.py checks that both leave the same group. False, having
        written nothing, for any other: the caller folds it in Python. The group's row is
        locked all the same, as fold's would be; the constraint's conflict stands in for fold's
        savepoint when two writers open one group at once; it takes no savepoint of its own, so
        if it fails (a field too long) the caller's transaction is left to roll back, as it is
        when any other write of it fails. Most events are info (scaling, sales), and fold's
        statements were a third of a sale's."""
        if (
            connection.vendor != "postgresql"
            or self.severity != Severity.INFO
            or self.pk is not None  # its own id: the insert below takes the sequence's
            or not (isinstance(self.time, datetime) and timezone.is_aware(self.time))  # fold refuses it
        ):
            return False
        group = _insert_values(EventGroup.opened_by(self), EventGroup)
        values = [*group, *_insert_values(self, Event, "group")]
        with connection.cursor() as cursor:
            cursor.execute(_fold_sql(), values)
            row = cursor.fetchone()
        if row is None:
            return False
        self.pk, self.group_id = row
        self._state.adding, self._state.db = False, connection.alias
        return True

    def acknowledge(self, by: str, now: datetime) -> bool:
        """Mark as seen by `by`; False if someone already had (the first acknowledgement stands)."""
        claimed = Event.objects.filter(pk=self.pk, acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=by
        )
        self.refresh_from_db(fields=["acknowledged_at", "acknowledged_by"])
        return claimed == 1

    @classmethod
    def record(
        cls,
        kind: str,
        message: str,
        *,
        endpoint: "Endpoint | None" = None,
        tenant: Tenant | None = None,
        **fields: Any,
    ) -> "Event":
        """Write an event and count it into its group; the endpoint, when given, also sets the tenant."""
        if endpoint is not None:
            tenant = endpoint.tenant
            fields.setdefault("endpoint_name", endpoint.name)
        return cls.objects.create(kind=kind, message=message, endpoint=endpoint, tenant=tenant, **fields)


@functools.cache
def _inserted(model: type[models.Model], skip: str = "") -> tuple[Any, ...]:
    """The fields of a model an insert here writes: all its columns but its primary key and the
    field `skip`."""
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key and f.name != skip)


def _insert_values(obj: models.Model, model: type[models.Model], skip: str = "") -> list[Any]:
    """An unsaved instance's values for _inserted(model, skip), as its INSERT would write them
    (defaults, auto fields' pre_save)."""
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in _inserted(model, skip)]


@functools.cache
def _fold_sql() -> str:
    """Event._fold_and_insert's statement: the group opened or counted, then the event."""
    quote = connection.ops.quote_name
    group_columns = [quote(str(f.column)) for f in _inserted(EventGroup)]  # concrete: each has one
    columns = [quote(str(f.column)) for f in _inserted(Event, "group")]
    return (
        f"WITH g AS (INSERT INTO {quote(EventGroup._meta.db_table)} AS old ({', '.join(group_columns)})"
        f" VALUES ({', '.join(['%s'] * len(group_columns))})"
        f" ON CONFLICT (fingerprint) WHERE NOT (state = '{EventGroup.State.RESOLVED}') DO UPDATE SET"
        " count = old.count + 1, first_at = LEAST(old.first_at, excluded.first_at),"
        " last_at = GREATEST(old.last_at, excluded.last_at),"
        " message = CASE WHEN excluded.last_at >= old.last_at THEN excluded.message ELSE old.message END,"
        " pod = CASE WHEN excluded.last_at >= old.last_at THEN excluded.pod ELSE old.pod END"
        f" WHERE old.severity = '{Severity.INFO}' RETURNING old.id)"
        f" INSERT INTO {quote(Event._meta.db_table)} ({', '.join(columns)}, group_id)"
        f" SELECT {', '.join(['%s'] * len(columns))}, g.id FROM g RETURNING id, group_id"
    )
