"""Paging: the groups that page go to ONCALL_WEBHOOK_URL as Alertmanager webhook JSON.

One POST per change of a group: `firing` once when it first pages (a critical group, or a
warning one with ONCALL_PAGE_WARNINGS=1, not silenced), `firing` again when its severity rises
(its labels changed: severity=critical; a rise also lifts a silence), `resolved` once when a
group that fired is resolved (by an operator, or by `EventGroup.resolve_quiet` when it has had no repeat for
ONCALL_RESOLVE_AFTER_S). The body is what Alertmanager's webhook receiver sends (version 4:
status, groupKey, labels, annotations, alerts[] with startsAt/endsAt and generatorURL), so
anything that takes Alertmanager's webhook takes ours, plus a Slack-style `text` field for chat
webhooks that read only that.

Delivery is claimed per group with a filtered update (two workers never send one page twice),
retried with exponential backoff (5 s doubling to 10 min) while the receiver fails, and run by
Celery: `controlplane.oncall.tasks.deliver_pages` is queued when a transaction that made a page
due commits, and the beat's `oncall-sweep` picks up retries and quiet groups.
"""

import json
import logging
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from controlplane.oncall.models import EventGroup

log = logging.getLogger("controlplane.oncall.paging")

BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 600.0
CLAIM_S = 60.0  # a claimed delivery not finished in this long is another worker's to retry
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing
TIMES = "\u00d7"  # the count is written x200 with the multiplication sign, as on the console


def backoff_s(attempt: int) -> float:
    """Delay after failed attempt `attempt` (1-based): 5 s, 10 s, 20 s ... capped at 10 min."""
    return float(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempt - 1)))


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def console_url(path: str) -> str:
    return settings.ONCALL_CONSOLE_URL.rstrip("/") + path


def alert_payload(group: EventGroup) -> dict[str, Any]:
    """The Alertmanager webhook body (version 4) for one group, in its current state."""
    status = "resolved" if group.state == EventGroup.State.RESOLVED else "firing"
    where = "/".join(x for x in (group.tenant.name if group.tenant else "", group.endpoint_name) if x)
    labels = {
        "alertname": f"mu_{group.kind}",
        "severity": group.severity,
        "kind": group.kind,
        "tenant": group.tenant.name if group.tenant else "",
        "endpoint": group.endpoint_name,
        "pod": group.pod,
        "group_id": str(group.pk),
    }
    labels = {k: v for k, v in labels.items() if v}
    runbook = console_url(reverse("console:runbook", args=[group.kind]))
    link = console_url(reverse("console:oncall") + f"?group={group.pk}")
    annotations = {
        "summary": group.message,
        "description": f"{TIMES}{group.count} {group.pattern}"
        f" (first {_iso(group.first_at)}, last {_iso(group.last_at)})",
        "runbook_url": runbook,
    }
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": _iso(group.first_at),
        "endsAt": _iso(group.resolved_at) if status == "resolved" and group.resolved_at else ZERO_TIME,
        "generatorURL": link,
        "fingerprint": group.fingerprint[:16],
    }
    text = (
        f"[{status.upper()}] {group.severity} {group.kind}{' on ' + where if where else ''}: "
        f"{group.message} ({TIMES}{group.count}) {link}"
    )
    return {
        "version": "4",
        "groupKey": f"oncall/{group.pk}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "oncall-webhook",
        "groupLabels": {"alertname": labels["alertname"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": console_url(reverse("console:oncall")),
        "alerts": [alert],
        "text": text,
    }


def post(url: str, body: dict[str, Any], timeout_s: float) -> None:
    """POST the JSON; raises OSError (or HTTPError) unless the receiver answers 2xx."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # the operator's URL
        resp.read()


def deliver_after_commit() -> None:
    """Queue a delivery for when the current transaction commits (nothing when no webhook is set)."""
    if not settings.ONCALL_WEBHOOK_URL:
        return

    def queue() -> None:
        from controlplane.oncall.tasks import deliver_pages

        try:
            deliver_pages.delay()
        except Exception as exc:  # the broker is down: the beat's sweep delivers it later
            log.warning("could not queue a page delivery (%s); the sweep will send it", exc)

    transaction.on_commit(queue)


def _due(now: datetime) -> Any:
    return EventGroup.objects.filter(page_due=True).filter(
        Q(page_retry_at__isnull=True) | Q(page_retry_at__lte=now)
    )


def process_one(now: datetime) -> bool:
    """Deliver one due page. False when none is due (or another worker claimed it first)."""
    url = settings.ONCALL_WEBHOOK_URL
    if not url:
        return False
    candidate = _due(now).order_by("id").values_list("pk", "page_retry_at").first()
    if candidate is None:
        return False
    pk, retry_at = candidate
    claimed = EventGroup.objects.filter(pk=pk, page_due=True, page_retry_at=retry_at).update(
        page_retry_at=now + timedelta(seconds=CLAIM_S)
    )
    if claimed != 1:
        return True  # another worker has it; look for the next
    group = EventGroup.objects.select_related("tenant").get(pk=pk)
    state = group.state
    if state != EventGroup.State.RESOLVED and (group.silenced(now) or not group.pages()):
        EventGroup.objects.filter(pk=pk).update(page_due=False, page_retry_at=None)
        return True
    body = alert_payload(group)
    try:
        post(url, body, settings.ONCALL_WEBHOOK_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        attempts = group.page_attempts + 1
        EventGroup.objects.filter(pk=pk).update(
            page_attempts=attempts,
            page_retry_at=now + timedelta(seconds=backoff_s(attempts)),
            page_error=f"{type(exc).__name__}: {exc}"[:300],
        )
        log.warning("page of group %d failed (attempt %d): %s", pk, attempts, exc)
        return True
    sent = {"paged": body["status"], "page_attempts": 0, "page_retry_at": None, "page_error": ""}
    same = {"state": state, "severity": group.severity}
    if not EventGroup.objects.filter(pk=pk, **same).update(page_due=False, **sent):
        # resolved, or escalated, while this page was on its way: the change is due in turn
        EventGroup.objects.filter(pk=pk).update(page_due=True, **sent)
    log.info("paged group %d: %s", pk, body["status"])
    return True


def deliver_due(now: datetime | None = None, limit: int = 100) -> int:
    """Deliver what is due now, at most `limit` pages; the number of groups handled."""
    handled = 0
    while handled < limit and process_one(now or timezone.now()):
        handled += 1
    return handled


def next_retry_in_s(now: datetime) -> float | None:
    """Seconds until the earliest delivery waiting for its retry, None when none waits."""
    first = (
        EventGroup.objects.filter(page_due=True, page_retry_at__gt=now)
        .order_by("page_retry_at")
        .values_list("page_retry_at", flat=True)
        .first()
    )
    return None if first is None else max(0.0, (first - now).total_seconds())
