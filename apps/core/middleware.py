import logging
import random
import time
from typing import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import UnreadablePostError

from .context import change_context
from .outages import outage_from_exception, outage_response
from .transactions import RETRY_WAIT_S, ROLLBACK_NOTE, RequestCommits, request_rollback_note

logger = logging.getLogger("tessera.transactions")


class ChangeContextMiddleware:
    """Attribute every model change made while serving a request (API or admin) to its requester."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with change_context(request=request, source="web"):
            return self.get_response(request)


class OutageMiddleware:
    """A view that fails because a service is away answers 503 (JSON under /api/, the page elsewhere)
    instead of the 500 page. Last in MIDDLEWARE, so that its process_exception runs first.

    A request answered so because PostgreSQL rolled its transaction back for a deadlock or a serialization
    failure (apps.core.transactions) is run once more, whole (URL resolution, every middleware's
    process_view, the view), before that answer goes out: nothing has been sent yet at this layer, and it
    is run again only when its body could be kept for a second reading and no transaction of the first
    run committed (`RequestCommits`), so the second run starts from what the first found. The REST
    framework's views answer the error themselves (apps.core.api.exceptions notes it on the request);
    other views raise it to `process_exception`."""

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        rerunnable = _body_kept(request)
        commits = RequestCommits()
        with connections[DEFAULT_DB_ALIAS].execute_wrapper(commits):
            response = self.get_response(request)
            if getattr(request, ROLLBACK_NOTE, False) and rerunnable and not commits.committed:
                setattr(request, ROLLBACK_NOTE, False)
                logger.info("%s %s: its transaction was rolled back for concurrency; running the request once more",
                            request.method, request.path)
                time.sleep(random.uniform(*RETRY_WAIT_S))  # noqa: S311  # nosec B311 - jitter, not security
                response = self.get_response(request)
        return response

    def process_exception(self, request, exception):
        outage = outage_from_exception(exception)
        if outage is None:
            return None
        request_rollback_note(request, exception)
        return outage_response(request, outage)


def _body_kept(request) -> bool:
    """Whether a second run of the request can read its body: none, or one read into memory now (as Django
    reads any body up to DATA_UPLOAD_MAX_MEMORY_SIZE; a larger one, an upload, is streamed once)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    if length <= 0:
        return True
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        return False
    try:
        request.body  # noqa: B018 - kept by the request (request._body) for every later reading
    except (UnreadablePostError, OSError):
        return False
    return True
