"""The local cluster driver: the `ClusterDriver` interface over the local agent's HTTP API.

Every call carries the agent's token (``Authorization: Bearer``), read from ``token_file``, the
file the agent reads it from (CLUSTER_AGENT_TOKEN_FILE; mode 600, else refused). Deployments
go to the agent with their events credential, the one thing it must know that it never shows.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from dataplane.cluster.driver import ClusterError, Deployment, PodState
from dataplane.keys import read_private_file


class LocalDriver:
    def __init__(self, url: str, token_file: str, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.timeout_s = timeout_s
        self._token: str | None = None

    def apply(self, deployments: Sequence[Deployment]) -> None:
        body = {"deployments": [d.to_json(with_secrets=True) for d in deployments]}
        self._call("PUT", "/deployments", body)

    def scale(self, name: str, replicas: int) -> None:
        self._call("PATCH", f"/deployments/{name}", {"replicas": replicas})

    def set_target_concurrency(self, name: str, target: int) -> None:
        self._call("PATCH", f"/deployments/{name}", {"target_concurrency": target})

    def list_pods(self) -> list[PodState]:
        return [PodState.from_json(p) for p in self._call("GET", "/pods")["pods"]]

    def token(self) -> str:
        if self._token is None:
            if not self.token_file:
                raise ClusterError("no token for the local cluster agent: set CLUSTER_AGENT_TOKEN_FILE")
            try:
                self._token = read_private_file(self.token_file, "cluster agent token")
            except ValueError as exc:
                raise ClusterError(str(exc)) from None
        return self._token

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json", "authorization": f"Bearer {self.token()}"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            err.close()
            raise ClusterError(f"local cluster agent {method} {path}: {err.code} {detail}") from None
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"local cluster agent at {self.url} unreachable: {exc}") from None
