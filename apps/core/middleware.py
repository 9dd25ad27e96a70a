from typing import Callable

from .context import change_context
from .outages import outage_from_exception, outage_response


class ChangeContextMiddleware:
    """Attribute every model change made while serving a request (API or admin) to its requester."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with change_context(request=request, source="web"):
            return self.get_response(request)


class OutageMiddleware:
    """A view that fails because a service is away answers 503 (JSON under /api/, the page elsewhere)
    instead of the 500 page. Last in MIDDLEWARE, so that its process_exception runs first."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        outage = outage_from_exception(exception)
        return None if outage is None else outage_response(request, outage)
