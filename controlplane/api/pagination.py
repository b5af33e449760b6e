"""Pages of 50 by default (?page=, ?page_size= up to 500); events use a cursor instead."""

from typing import TYPE_CHECKING, Any

from django.core.paginator import Page, Paginator
from django.db.models import Model, QuerySet
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request


class LateJoinPaginator(Paginator):
    """Finds a page's primary keys first, then joins only those rows.

    A deep page (OFFSET 5000 of 10,000 endpoints) otherwise joins tenant, pool, profile and
    reservation for every skipped row; the key-only scan skips them through the index.
    """

    object_list: QuerySet[Model]  # DRF pages querysets only (the viewsets' get_queryset())

    def page(self, number: int | str) -> Page[Any]:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)
        keys = list(self.object_list.values_list("pk", flat=True)[bottom:top])
        rows = {row.pk: row for row in self.object_list.filter(pk__in=keys)}
        return self._get_page([rows[key] for key in keys], number, self)

    if TYPE_CHECKING:  # the hook Django's own page() calls to make the Page; django-stubs leave it out

        def _get_page(
            self, object_list: list[Model], number: int, paginator: Paginator[Model]
        ) -> Page[Any]: ...


def strict_page_size(request: Request, param: str, default: int, most: int) -> int:
    """?page_size= must be a positive integer (a bad one is a 400, not silently the default);
    above `most` it is `most`."""
    raw = request.query_params.get(param)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValidationError({param: [f"must be a positive integer, got {raw!r}"]})
    return min(int(raw), most)


class PageNumberPagination(pagination.PageNumberPagination):
    def get_page_size(self, request: Request) -> int:
        return strict_page_size(request, self.page_size_query_param, self.page_size, self.max_page_size)

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

    def get_page_size(self, request: Request) -> int:
        return strict_page_size(request, self.page_size_query_param, self.page_size, self.max_page_size)
