"""Pods' events credentials: ``mupod_<endpoint id>_<hmac>``, one per endpoint, derived, not stored.

A pod posts its hang, restart and crash-loop events to ``POST /api/v1/events/``. It holds this
credential, not the operator key: it may post its own endpoint's events and do nothing else
(``controlplane.api.auth`` makes it a ``PodPrincipal``, which no permission but the events
create admits). The HMAC is Django's ``salted_hmac`` under SECRET_KEY, so nothing new is stored;
a credential made under a key in SECRET_KEY_FALLBACKS still verifies, so that the secret key
rotates like Django's sessions do (pods get the new credential as their deployments are rolled).
"""

from __future__ import annotations

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

PREFIX = "mupod_"
# The salt keeps the module's first name (controlplane.api): a new one would change every key.
_SALT = "controlplane.api.pod_keys.events"


def _mac(endpoint_id: int, secret: str) -> str:
    return salted_hmac(_SALT, str(endpoint_id), secret=secret, algorithm="sha256").hexdigest()


def events_key(endpoint_id: int) -> str:
    """The events credential of endpoint ``endpoint_id``'s pods, under the current SECRET_KEY."""
    return f"{PREFIX}{endpoint_id}_{_mac(endpoint_id, settings.SECRET_KEY)}"


def is_events_key(secret: str) -> bool:
    """Whether ``secret`` is of this kind (not whether it verifies): an API key never is."""
    return secret.startswith(PREFIX)


def endpoint_of(secret: str) -> int | None:
    """The endpoint whose events ``secret`` may post; None when it does not verify under
    SECRET_KEY or any of SECRET_KEY_FALLBACKS."""
    endpoint, sep, mac = secret.removeprefix(PREFIX).partition("_")
    if not is_events_key(secret) or not sep or not endpoint.isascii() or not endpoint.isdigit():
        return None
    if len(endpoint) > 18:  # not an id of ours; keeps int() small
        return None
    endpoint_id = int(endpoint)
    secrets = [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    if any(constant_time_compare(mac, _mac(endpoint_id, key)) for key in secrets):
        return endpoint_id
    return None
