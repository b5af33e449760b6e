"""Tenants, their API keys, and who is asking (a tenant or an operator).

Tenant scoping lives here and only here: `TenantScopedQuerySet.visible_to(principal)`.
"""
