"""The web console: capacity allocation, endpoints, and the on-call view; server-rendered with htmx.

Pages are scoped exactly like the API: the same `visible_to(principal)` querysets and FilterSets,
and writes go through the API's serializers so both front doors validate alike.
"""
