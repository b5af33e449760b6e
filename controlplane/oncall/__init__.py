"""On-call: events (hangs, restarts, crash loops, scale steps, rollouts, benchmarks) and views."""
