"""`python manage.py watch_pods`: record the runtime pods' restarts and crash loops as Events.

Runs the Kubernetes pod watcher (dataplane.cluster.kubernetes.PodWatcher) on
KUBERNETES_NAMESPACE until SIGTERM or SIGINT: list, then watch the pods of the control plane's
Deployments; a container whose restartCount goes up is a `restart` event (with the reason its
last run ended: Error, OOMKilled, the liveness probe's kill), one entering CrashLoopBackOff a
critical `crash_loop` event. Run exactly one (the manifests' `controlplane-podwatch`: one
replica, Recreate): two would record every event twice. Restarts that happen while it is down
are reported when it comes back only if it finds the pod's earlier count (a relist after a lost
watch does; a fresh start takes the counts it finds as history).
"""

import logging
import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections, connections

from controlplane import pods
from dataplane.wire.pod_events import PodEvent

log = logging.getLogger("controlplane.watch_pods")


class Command(BaseCommand):
    help = "Watch the runtime pods on Kubernetes; record restarts and crash loops as on-call events."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--namespace", default=None, help="default: KUBERNETES_NAMESPACE")

    def handle(self, namespace: str | None = None, **options: Any) -> None:
        from dataplane.cluster.kubernetes import PodWatcher

        namespace = namespace or settings.KUBERNETES_NAMESPACE

        def record(event: PodEvent) -> None:
            close_old_connections()  # a long-lived process: drop a connection the database closed
            pods.record_pod_event(event)
            log.info("%s: %s", event.kind, event.message)

        watcher = PodWatcher(namespace, record)
        stop = threading.Event()

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            stop.set()
            watcher.stop()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        self.stderr.write(f"watching pods in namespace {namespace}")

        def run() -> None:
            try:
                watcher.run()
            finally:
                connections.close_all()  # this thread's database connection, opened by record()

        thread = threading.Thread(target=run, name="podwatch", daemon=True)
        thread.start()
        try:
            while thread.is_alive() and not stop.is_set():
                stop.wait(1.0)
        finally:
            watcher.stop()
            thread.join(10)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
