"""Runtime pods: one inference engine plus the prober that watches it.

A pod is a vLLM OpenAI server (``launcher``) or, where no GPU can be had, a clearly labelled
simulated engine (``sim`` driven by the pure ``engine_model.perf_model``), plus a prober (``prober`` state
machine, ``probe_server`` I/O) that sends a tiny top-priority completion when the engine has
been quiet, fails ``/livez`` when it hangs, and reports events to the control plane
(``events``). ``pod`` runs one pod in the foreground; ``supervisor`` runs many locally and
restarts the ones that hang or die (``pod_process``: what to run for a pod, and how it is
started and killed), starting new ones from a ``warm_pool`` of ``warm`` processes that have
imported already. Pure modules take time as a parameter and do no I/O.
"""
