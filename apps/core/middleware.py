from .context import change_context


class ChangeContextMiddleware:
    """Attribute every model change made while serving a request (API or admin) to its requester."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with change_context(request=request, source="web"):
            return self.get_response(request)
