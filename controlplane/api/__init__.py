"""The REST API under /api/v1/: bearer-key auth, tenant-scoped viewsets, one error mapping."""
