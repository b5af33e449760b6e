"""The autoscaler's configuration per endpoint: the defaults (capacity.autoscaler's, with the
decider's ticks from the beat intervals, the one cadence every endpoint is decided on), an
endpoint's stored overrides checked against them (no cadence of its own, and no more load
history than a pass is sized for and the buckets are kept), and the config a pass decides on,
the defaults where stored overrides are no longer valid. The API checks an endpoint's settings
here; the passes (controlplane.scaling) read them from here.
"""

from __future__ import annotations

import logging

from django.conf import settings

from capacity.autoscaler import AutoscalerConfig
from capacity.autoscaler.horizontal import lookback_s
from controlplane.endpoints.models import Endpoint

log = logging.getLogger("controlplane.scaling")  # its name before it moved out of controlplane.scaling

# A minute is recorded for the forecast this long after it ends, when its seconds are collected.
MINUTE_SETTLE_S = 10


# One pass decides every endpoint, on beat's schedule, so the passes' cadence is the settings'
# and no endpoint has its own: an override of these keys is refused, naming the setting.
CADENCE_SETTINGS = {
    "tick_s": "AUTOSCALER_HORIZONTAL_INTERVAL_S",
    "vertical_tick_s": "AUTOSCALER_VERTICAL_INTERVAL_S",
}


def base_config() -> AutoscalerConfig:
    """The defaults, with the decider's ticks from the beat intervals (the one cadence)."""
    return AutoscalerConfig(
        tick_s=settings.AUTOSCALER_HORIZONTAL_INTERVAL_S,
        vertical_tick_s=settings.AUTOSCALER_VERTICAL_INTERVAL_S,
    )


# The settings that set how far back a horizontal pass reads an endpoint's buckets.
HISTORY_SETTINGS = (
    "scale_up_window_s", "scale_down_window_s", "burst_memory_s", "pod_start_s", "scale_to_zero_grace_s",
)  # fmt: skip


def history_horizon_s(cfg: AutoscalerConfig) -> float:
    """Seconds of buckets a horizontal pass loads for an endpoint: as far as its decider reads
    back, its idle grace period, and the forecast's recorder to the last settled minute. (The
    calm history's judgement reads the spans since the last pass: `calm.lookback_s`.)"""
    return max(lookback_s(cfg), cfg.scale_to_zero_grace_s, 120 + MINUTE_SETTLE_S)


def max_history_s() -> float:
    """The longest horizon an endpoint may set: what the pass is sized for, and what is kept."""
    return min(settings.AUTOSCALER_MAX_HISTORY_S, settings.LOAD_BUCKET_RETENTION_S)


def config_from_overrides(overrides: dict[str, object]) -> AutoscalerConfig:
    """An endpoint's config: the base with its overrides; ValueError naming a bad key or value.
    A tenant's windows are bounded together: each pass loads every endpoint's horizon of buckets,
    so a day of burst_memory_s would make one tenant's endpoint cost the pass 17,000 rows."""
    for key, setting in CADENCE_SETTINGS.items():
        if key in overrides:
            raise ValueError(
                f"autoscaler setting {key!r} cannot be set per endpoint: every endpoint is decided"
                f" on the control plane's cadence ({setting})"
            )
    cfg = AutoscalerConfig.from_overrides(overrides, base=base_config())
    horizon, limit = history_horizon_s(cfg), max_history_s()
    if horizon > limit:
        named = ", ".join(f"{k}={overrides[k]!r}" for k in HISTORY_SETTINGS if k in overrides)
        raise ValueError(
            f"autoscaler settings {named} read {horizon:g} s of load history at each decision;"
            f" at most {limit:g} s (AUTOSCALER_MAX_HISTORY_S, LOAD_BUCKET_RETENTION_S)"
        )
    return cfg


def config_for(endpoint: Endpoint) -> AutoscalerConfig:
    """The config a pass decides on. Overrides stored before a limit or a setting changed are
    no longer valid: that endpoint is decided on the defaults (and a warning says why) rather
    than every endpoint's pass failing on it."""
    try:
        return config_from_overrides(endpoint.autoscaler or {})
    except ValueError as exc:
        log.warning(
            "endpoint %s: stored autoscaler settings refused, decided on the defaults: %s", endpoint.pk, exc
        )
        return base_config()
