"""The embedded stack's own processes on on-call (`make run`: the Celery worker with beat, the
cluster agent, the router, the control plane, Redis): a death of one, recorded by the stack's
supervisor (`manage.py record_stack_event`), is an event reported by REPORTER on the pod
`stack-<process>`, which the on-call page's attention panel counts apart from the fleet's pods."""

REPORTER = "stack supervisor"
POD_PREFIX = "stack-"


def pod_of(process: str) -> str:
    """'cluster agent' -> 'stack-cluster-agent'."""
    return POD_PREFIX + process.replace(" ", "-")
