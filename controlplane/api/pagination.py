"""Pages of 50 by default (?page=, ?page_size= up to 500); events use a cursor instead.

Each of these parameters is read as controlplane.api.params reads its kind: a bad one is a 400
naming it (a forged cursor too: DRF would answer 404, or 500 for one whose position is no id).
"""

from typing import TYPE_CHECKING, Any

from django.core.paginator import Page, Paginator
from django.db.models import Model, QuerySet
from rest_framework import pagination
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request

from controlplane.api import params


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


def query_integer(request: Request, param: str, lowest: int = 1) -> int | None:
    """The query parameter as controlplane.api.params reads an integer; None when absent."""
    raw = request.query_params.get(param)
    if raw is None:
        return None
    try:
        return params.integer(param, raw, lowest=lowest)
    except params.ParameterError as exc:
        raise ValidationError({param: [exc.message]}) from None


def strict_page_size(request: Request, param: str, default: int, most: int) -> int:
    """?page_size= must be a positive integer (a bad one is a 400, not silently the default);
    above `most` it is `most`."""
    size = query_integer(request, param)
    return default if size is None else min(size, most)


class PageNumberPagination(pagination.PageNumberPagination):
    def get_page_number(self, request: Request, paginator: "Paginator[Any]") -> int:
        """A page number is a positive integer (a 400 naming ?page= otherwise); "last" is the last
        page; one past the last is DRF's 404."""
        raw = request.query_params.get(self.page_query_param)
        if not raw:
            return 1
        if raw in self.last_page_strings:
            return paginator.num_pages
        return query_integer(request, self.page_query_param) or 1

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

    def decode_cursor(self, request: Request) -> pagination.Cursor | None:
        """DRF's cursor, refused with a 400 naming ?cursor= when it is not one DRF made: not base64,
        or a position (an event id, under the -id ordering) that is no id."""
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise ValidationError({self.cursor_query_param: ["is not a cursor this API made"]}) from None
        if cursor is not None and cursor.position is not None:
            try:
                params.integer(self.cursor_query_param, str(cursor.position))  # a str, whatever the stubs say
            except params.ParameterError:
                raise ValidationError({self.cursor_query_param: ["is not a cursor this API made"]}) from None
        return cursor
