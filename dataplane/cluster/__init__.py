"""Clusters that run runtime pods, behind one small driver interface.

`driver.ClusterDriver` is what the autoscaler and the control plane call: declare deployments,
scale one, push its target concurrency, list pods with readiness. `local.LocalDriver` talks to
`agent`, the local cluster (`python -m dataplane.cluster.agent`): a process that keeps each
deployment's replicas running as supervised local processes, the way a kubelet would. The
Kubernetes driver implements the same interface against a real API server.
"""
