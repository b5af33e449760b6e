"""Endpoints: a tenant's model served on a GPU pool, with provisioned concurrency and replicas."""
