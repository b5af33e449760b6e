"""The embedded stack of `make run` (scripts/run-local.sh): its processes, started and watched on
one machine by `python -m controlplane.localstack.supervisor`, which restarts one that dies with
a capped exponential backoff (controlplane.localstack.backoff) and records it as an on-call event.
"""
