"""`{{ event.message|as_seen_by:request.principal }}`: what a viewer may read of an event's text.

Operators read it as written; a tenant reads it with the fleet's addresses (pod URLs, IPs)
redacted (controlplane.oncall.grouping.redact_addresses), on every page that shows events.
"""

from django import template

from controlplane.oncall.grouping import redact_addresses
from controlplane.tenants.models import Principal

register = template.Library()


@register.filter
def as_seen_by(text: str, principal: Principal | None) -> str:
    if principal is not None and principal.is_operator:
        return text
    return redact_addresses(str(text))
