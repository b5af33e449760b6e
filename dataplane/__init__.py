"""The data plane: the processes that serve inference traffic.

Router, runtime pods (vLLM launcher, prober, simulated engine) and cluster drivers live here.
Nothing in this package imports Django or ``controlplane``; it talks to the control plane only
over HTTP, so it keeps serving with what it has when the control plane is down.
"""
