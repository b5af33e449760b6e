"""The bounds on a tenant's API keys, decided in one place: at most ``API_KEYS_PER_TENANT_MAX``
active (not revoked) keys at once, and at most ``API_KEY_CREATIONS_PER_HOUR`` made in any hour
(revoked ones count: making and revoking keys in a loop is what the rate bounds). A person never
meets either; a script making 300 keys in a few seconds meets both. Operators' keys are exempt:
only operators make them. Pure: ``ApiKey.issue`` counts under a lock on the tenant's row and asks
``refusal`` whether one more may be made.
"""

CREATION_WINDOW_S = 3600.0  # the rate's window: API_KEY_CREATIONS_PER_HOUR keys in any hour


class KeyLimitReached(Exception):
    """A tenant key refused: ``status`` 409 (the cap: revoke one first) or 429 (the rate, with
    ``retry_after_s`` until the oldest creation in the window leaves it)."""

    def __init__(self, status: int, message: str, retry_after_s: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


def refusal(
    tenant: str,
    active: int,
    made_in_window: int,
    oldest_in_window_age_s: float,
    cap: int,
    per_hour: int,
) -> KeyLimitReached | None:
    """Why one more key for ``tenant`` is refused, or None when it may be made: ``active`` keys
    now (cap 100: the 101st is refused), ``made_in_window`` in the last hour, the oldest of them
    ``oldest_in_window_age_s`` old (60 in the hour, the oldest 3,000 s old -> 429 retry in 600 s)."""
    if active >= cap:
        return KeyLimitReached(
            409,
            f"tenant {tenant!r} has {active} active API keys, the most it may have "
            f"(API_KEYS_PER_TENANT_MAX={cap}): revoke one to make another",
        )
    if made_in_window >= per_hour:
        retry = max(1, int(CREATION_WINDOW_S - oldest_in_window_age_s + 0.999))
        return KeyLimitReached(
            429,
            f"tenant {tenant!r} made {made_in_window} API keys in the last hour, the most it may "
            f"(API_KEY_CREATIONS_PER_HOUR={per_hour}): retry in {retry} s",
            retry,
        )
    return None
