"""The data plane: the router and the runtime pods. No Django imports; runs in its own processes."""
