"""The console's personas (a tenant's engineer, another tenant's, an operator) for on-call."""

from tests.console.conftest import fast_password_hashing, operator_web, other_web, owner_web

__all__ = ["fast_password_hashing", "operator_web", "other_web", "owner_web"]
