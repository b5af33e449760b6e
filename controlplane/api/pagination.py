"""Pages of 50 by default (?page=, ?page_size= up to 500); events use a cursor instead."""

from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class EventCursorPagination(pagination.CursorPagination):
    # Ids only grow, so a cursor over -id never misses nor repeats an event while new ones land.
    ordering = "-id"
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000
