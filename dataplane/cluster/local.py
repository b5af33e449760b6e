"""The local cluster driver: the `ClusterDriver` interface over the local agent's HTTP API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from dataplane.cluster.driver import ClusterError, Deployment, PodState


class LocalDriver:
    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def apply(self, deployments: Sequence[Deployment]) -> None:
        self._call("PUT", "/deployments", {"deployments": [d.to_json() for d in deployments]})

    def scale(self, name: str, replicas: int) -> None:
        self._call("PATCH", f"/deployments/{name}", {"replicas": replicas})

    def set_target_concurrency(self, name: str, target: int) -> None:
        self._call("PATCH", f"/deployments/{name}", {"target_concurrency": target})

    def list_pods(self) -> list[PodState]:
        return [PodState.from_json(p) for p in self._call("GET", "/pods")["pods"]]

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            err.close()
            raise ClusterError(f"local cluster agent {method} {path}: {err.code} {detail}") from None
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"local cluster agent at {self.url} unreachable: {exc}") from None
