"""Pages of 50 by default (?page=, ?page_size= up to 500); events use a cursor instead."""

from django.core.paginator import Paginator
from rest_framework import pagination


class LateJoinPaginator(Paginator):
    """Finds a page's primary keys first, then joins only those rows.

    A deep page (OFFSET 5000 of 10,000 endpoints) otherwise joins tenant, pool, profile and
    reservation for every skipped row; the key-only scan skips them through the index.
    """

    def page(self, number):
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)
        keys = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = {row.pk: row for row in self.object_list.filter(pk__in=keys)}
        return self._get_page([rows[key] for key in keys], number, self)


class PageNumberPagination(pagination.PageNumberPagination):
    django_paginator_class = LateJoinPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class EventCursorPagination(pagination.CursorPagination):
    # Ids only grow, so a cursor over -id never misses nor repeats an event while new ones land.
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000
