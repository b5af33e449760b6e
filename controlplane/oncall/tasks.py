"""Celery tasks of on-call: thin wrappers over paging and the group sweep."""

from celery import shared_task
from django.utils import timezone

from controlplane.oncall import paging
from controlplane.oncall.models import EventGroup


@shared_task
def deliver_pages() -> int:
    """Send the pages that are due; when this run handled some and a retry waits, come back when
    the first is due. A run that found nothing to do ends its chain, so concurrent runs collapse
    into one (the beat's sweep is the safety net if this task is lost)."""
    handled = paging.deliver_due()
    wait = paging.next_retry_in_s(timezone.now())
    if handled and wait is not None:
        deliver_pages.apply_async(countdown=wait + 0.1)
    return handled


@shared_task
def oncall_sweep() -> int:
    """Resolve the groups that have been quiet long enough, then deliver what is due."""
    now = timezone.now()
    resolved = EventGroup.resolve_quiet(now)
    return resolved + paging.deliver_due(now)
