from rest_framework.pagination import LimitOffsetPagination


class TesseraPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 1000
