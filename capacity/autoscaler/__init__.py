"""The two-axis autoscaler, pure: no clock, no I/O, no Django; time is a parameter.

Stages joined by narrow types (after Knative): the collector (elsewhere) turns the routers'
per-second samples into 5-second `Bucket`s; `window.aggregate` averages them over a window
(a `Timeline` keeps an endpoint's in order, each window a slice of it); `horizontal.decide`
picks replicas every 5 s, on state carried from pass to pass (`calm`: how long traffic went
without a burst; `series`: the series of bursts it is in); `vertical.decide` retunes each
replica's target concurrency every 30 s (the horizontal decider's denominator), `forecast` may
raise the minimum ahead of a recurring peak, and `wording` puts a horizontal decision in words
for its scale event. The actuator (Celery beat + a cluster driver) lives outside.
Missing data is a result: a decision with `replicas=None` says why nothing was decided.
"""

from capacity.autoscaler import calm, series, wording
from capacity.autoscaler.config import AutoscalerConfig
from capacity.autoscaler.horizontal import Decision, EndpointSpec, Rule, decide
from capacity.autoscaler.vertical import ConcurrencyDecision, decide_concurrency
from capacity.autoscaler.window import Bucket, Load, Timeline, aggregate

__all__ = [
    "AutoscalerConfig",
    "Bucket",
    "ConcurrencyDecision",
    "Decision",
    "EndpointSpec",
    "Load",
    "Rule",
    "Timeline",
    "aggregate",
    "calm",
    "decide",
    "decide_concurrency",
    "series",
    "wording",
]
