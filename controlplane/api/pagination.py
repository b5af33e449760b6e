"""How lists page. Those that grow with the fleet (endpoints, pods, reservations) and events
page through a cursor (?cursor=): each page is an index scan from where the page before ended,
the same cost at any depth, and no total is counted (keyset_page); endpoints, pods and reservations still
answer ?page=N as before (with `count`). Other lists are numbered pages of 50 (?page=). Each
parameter (?page_size= too, up to 500) is read as controlplane.api.params reads its kind: a bad
one is a 400 naming it (a forged cursor too: DRF would answer 404, or 500 for one whose
position is no id).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.paginator import Page, Paginator
from django.db.models import F, Model, QuerySet
from rest_framework import pagination
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api import params

_M = TypeVar("_M", bound=Model)


class LateJoinPaginator(Paginator):
    """Finds a page's primary keys first, then joins only those rows (rows_of).

    A deep page (OFFSET 5000 of 10,000 endpoints) otherwise joins tenant, pool, profile and
    reservation for every skipped row; the key-only scan skips them through the index. A page
    nearer the end than the start is read from the end (the order reversed, its keys put back):
    an offset of at most half the rows, under an order the primary key ends (`by_key`), which
    reversed lists the same rows backwards.
    """

    object_list: QuerySet[Model]  # DRF pages querysets only (the viewsets' get_queryset())
    columns: Sequence[str] | None = None

    def page(self, number: int | str) -> Page[Any]:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        top = min(bottom + self.per_page, self.count)
        key = self.object_list.model._meta.pk.attname
        keys = self.object_list.values_list(key, flat=True)
        if self.count - top < bottom and by_key(self.object_list):
            found = list(keys.reverse()[self.count - top : self.count - bottom])[::-1]
        else:
            found = list(keys[bottom:top])
        return self._get_page(rows_of(self.object_list, found, key, self.columns), number, self)

    if TYPE_CHECKING:  # the hook Django's own page() calls to make the Page; django-stubs leave it out

        def _get_page(
            self, object_list: list[Model], number: int, paginator: Paginator[Model]
        ) -> Page[Any]: ...


def by_key(rows: QuerySet[Model]) -> bool:
    """Whether `rows` are in an order that their primary key ends (a total order)."""
    ordering = rows.query.order_by or (rows.model._meta.ordering if rows.query.default_ordering else ())
    pk = rows.model._meta.pk
    last = ordering[-1] if ordering else None
    return isinstance(last, str) and last.lstrip("-") in ("pk", pk.name, pk.attname)


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

    # DRF calls this as django_paginator_class(queryset, page_size): a factory, not a class.
    def django_paginator_class(  # type: ignore[override]
        self, rows: QuerySet[Model], page_size: int
    ) -> LateJoinPaginator:
        paginator = LateJoinPaginator(rows, page_size)
        paginator.columns = self.columns
        return paginator

    columns: Sequence[str] | None = None  # a page's rows as plain rows of these (rows_of)
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class StrictCursorPagination(pagination.CursorPagination):
    """DRF's cursor over an id-valued ordering, with ?page_size= and ?cursor= read strictly."""

    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000

    def get_page_size(self, request: Request) -> int:
        return strict_page_size(request, self.page_size_query_param, self.page_size, self.max_page_size)

    def decode_cursor(self, request: Request) -> pagination.Cursor | None:
        """DRF's cursor, refused with a 400 naming ?cursor= when it is not one DRF made: not base64,
        or a position (an id, under these orderings) that is no id."""
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


class EventCursorPagination(StrictCursorPagination):
    # Ids only grow, so a cursor over -id never misses nor repeats an event while new ones land.
    ordering = "-id"


# A substring search this long has trigrams, which PostgreSQL's index on the names finds
# (endpoints migration 0018); a shorter one scans.
TRIGRAM = 3


def keyset_page(
    rows: QuerySet[_M],
    after: int | None,
    before: int | None,
    size: int,
    search: str = "",
    key: str = "id",
    columns: Sequence[str] | None = None,
) -> tuple[list[Any], bool, bool]:
    """The page of `rows` newest first by `key` (a unique, growing id): older than `after`,
    newer than `before`, else the newest; with whether there are newer and older rows beyond it.
    The page's keys come first, `WHERE id < after ORDER BY id DESC LIMIT size + 1` (a scan of
    the primary key, or of an index that leads with a filter's column then id, that stops with
    the page), then their rows with what they join: two queries, whatever the fleet's size.

    Under a `search` of TRIGRAM characters or more the matching keys are sorted instead (NULLS
    LAST is an order no index hands over): the trigram index finds them, however old, where the
    primary key read newest first would pass every newer row that does not match (the whole
    fleet, for a name among the oldest)."""
    sort = len(search) >= TRIGRAM
    newest_first = F(key).desc(nulls_last=True) if sort else F(key).desc()
    oldest_first = F(key).asc(nulls_first=True) if sort else F(key).asc()
    if before is not None:
        newer = rows.filter(**{f"{key}__gt": before}).order_by(oldest_first)
        keys = list(newer.values_list(key, flat=True)[: size + 1])
        if len(keys) > size:
            return rows_of(rows, keys[:size][::-1], key, columns), True, True
        # Nothing newer beyond this page: the newest page, full, as the first visit shows it.
        after = None
    older = rows if after is None else rows.filter(**{f"{key}__lt": after})
    keys = list(older.order_by(newest_first).values_list(key, flat=True)[: size + 1])
    return rows_of(rows, keys[:size], key, columns), after is not None, len(keys) > size


def rows_of(
    rows: QuerySet[_M], keys: list[Any], key: str = "id", columns: Sequence[str] | None = None
) -> list[Any]:
    """The rows of these keys in their order (one deleted since its key was read is left out):
    model instances or, given `columns` (Django lookups, `key` among them), plain dicts of those,
    one query that builds no instance."""
    if columns is None:
        found: dict[Any, Any] = rows.in_bulk(keys, field_name=key)
    else:
        page = rows.filter(**{f"{key}__in": keys}).order_by().prefetch_related(None).values(*columns)
        found = {row[key]: row for row in page}
    return [found[k] for k in keys if k in found]


def key_of(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, dict) else getattr(row, key)


class KeysetPagination(StrictCursorPagination):
    """Newest first through ?cursor= (`next` and `previous` links; no `count`): keyset_page, its
    queries bounded by the page whatever the fleet's size. The cursor is DRF's encoding of an id
    and whether the page reads newer or older than it. ?page=N answers the numbered page as before
    (PageNumberPagination: `count`, and `next` as ?page=N+1), an OFFSET that grows with N: for
    clients written against it."""

    page_size = 50
    max_page_size = 500
    key = "id"  # what the cursor holds (keyset_page)
    search_param = "search"  # the list's substring search, if it has one (keyset_page)
    columns: Sequence[str] | None = None  # a page's rows as plain rows of these (rows_of)
    numbered: PageNumberPagination | None = None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        page = PageNumberPagination.page_query_param
        if page in request.query_params:
            if self.cursor_query_param in request.query_params:
                raise ValidationError({page: [f"give ?{page}= or ?{self.cursor_query_param}=, not both"]})
            self.numbered = PageNumberPagination()
            self.numbered.columns = self.columns
            return self.numbered.paginate_queryset(queryset, request, view)
        self.request = request
        self.page_size = self.get_page_size(request)
        self.base_url = request.build_absolute_uri()
        self.cursor = self.decode_cursor(request)
        position = None if self.cursor is None or self.cursor.position is None else int(self.cursor.position)
        reverse = self.cursor is not None and self.cursor.reverse
        search = request.query_params.get(self.search_param, "")
        self.page, newer, older = keyset_page(
            queryset,
            None if reverse else position,
            position if reverse else None,
            self.page_size,
            search,
            self.key,
            self.columns,
        )
        first, last = (
            (key_of(self.page[0], self.key), key_of(self.page[-1], self.key)) if self.page else (0, 0)
        )
        self.newer = Cursor(offset=0, reverse=True, position=first) if newer else None
        self.older = Cursor(offset=0, reverse=False, position=last) if older else None
        return self.page

    def get_next_link(self) -> str | None:
        return None if self.older is None else self.encode_cursor(self.older)

    def get_previous_link(self) -> str | None:
        return None if self.newer is None else self.encode_cursor(self.newer)

    def get_paginated_response(self, data: Any) -> Response:
        if self.numbered is not None:
            return self.numbered.get_paginated_response(data)
        return super().get_paginated_response(data)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        body = super().get_paginated_response_schema(schema)
        body["properties"]["count"] = {
            "type": "integer",
            "description": "With ?page= only: how many rows match (a cursor's pages count nothing)",
        }
        return body

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        numbered = PageNumberPagination()
        page = numbered.page_query_param
        return [
            *super().get_schema_operation_parameters(view),
            {
                "name": page,
                "required": False,
                "in": "query",
                "description": "A numbered page, as before cursors (with `count`): its cost grows with N",
                "schema": {"type": "integer"},
            },
        ]


class ReservationPagination(KeysetPagination):
    """Reservations newest endpoint first (each endpoint has one at most): a tenant's page is
    then its endpoints' index read newest first, each joined to its reservation, and stops with
    the page; by the reservation's own id, the tenant on the endpoint, every reservation would be
    read and sorted."""

    key = "endpoint_id"
