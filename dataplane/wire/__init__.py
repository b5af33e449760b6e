"""Wire contracts: one module per message format that crosses a process boundary.

Each module is a wire contract shared by its writer and its reader: frozen dataclasses that
say what every field means (unit and invariant), with the codec that turns them into the bytes
on the wire and back, validation that names the bad field and value, and nothing else. No key
of these formats is spelled outside its module, so a rename on one side cannot go unnoticed.

    load_samples   the routers' per-second load samples (router -> Redis or the control plane
                   -> autoscaler)
    routing_table  the routing table (control plane -> routers)
    pod_events     the events a pod posts (prober, supervisor, agent -> control plane)
    prometheus_text  the rules of the Prometheus text scrapes we serve (router, simulated
                   engine -> Prometheus): label escaping, HELP and TYPE per family

The control plane imports these modules; they import neither Django nor ``controlplane``.
"""
