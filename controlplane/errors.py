"""The project's error views (handler400/403/404/500 in controlplane/urls.py). Django calls them when a
request fails outside the REST framework's own handling: an address that matches no URL, an exception no
view caught, a refused permission in a plain Django view. A path under /api/ gets JSON of the API's one
error shape (apps/core/api/exceptions.py: {"error": {"status": 404, "code": "not_found", "message": ...}}),
so CI scripts read the same body whether the router or a view refused; any other path gets the HTML page
(templates/400.html ... 500.html).

With DEBUG on (local settings, which the demo runs) Django answers an exception no view caught, or an address
that matches no URL, with its HTML debug pages instead of calling these views: ApiErrorsAsJsonMiddleware
turns such an answer under /api/ into the same JSON, so the API answers JSON whatever DEBUG says.

The 400 and 500 pages are rendered without the request (no context processors, no session, no database):
a 500 may come from the database being down. 403 and 404 render with the request, in the page shell."""
from __future__ import annotations

import logging
import sys
from http import HTTPStatus

from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseServerError, JsonResponse
from django.template import loader
from django.views.decorators.csrf import requires_csrf_token
from rest_framework import exceptions
from rest_framework.response import Response

from apps.core.api.exceptions import tessera_exception_handler
from apps.core.outages import outage_from_exception, outage_response

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"


class BadRequest(exceptions.APIException):
    status_code = 400
    default_detail = "Bad request."
    default_code = "bad_request"


class ServerError(exceptions.APIException):
    status_code = 500
    default_detail = "A server error occurred."
    default_code = "server_error"


def is_api_request(request) -> bool:
    return request.path_info.startswith(API_PREFIX)


def _message(exception) -> str | None:
    """The exception's own message when it is plain text (Django's URL resolver passes a dict of the
    patterns it tried, which is no message for a client)."""
    args = getattr(exception, "args", ())
    return args[0] if args and isinstance(args[0], str) and args[0] else None


def api_error(exc: exceptions.APIException) -> JsonResponse:
    """The API's error body for `exc`, built by the API's own exception handler."""
    response = tessera_exception_handler(exc, {})
    return JsonResponse(response.data, status=response.status_code)


def api_error_for_status(status: int) -> JsonResponse:
    """The API's error body for an HTTP error status (the generic message of that status)."""
    known = {400: BadRequest, 403: exceptions.PermissionDenied, 404: exceptions.NotFound, 500: ServerError}
    if status in known:
        return api_error(known[status]())
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    exc = exceptions.APIException(f"{phrase}.", code=phrase.lower().replace(" ", "_").replace("-", "_"))
    exc.status_code = status
    return api_error(exc)


class ApiErrorsAsJsonMiddleware:
    """Under /api/, an error answer that is not JSON (Django's HTML debug pages with DEBUG on) becomes the
    API's JSON error of the same status, nothing of the debug page kept. REST framework responses are left
    alone: the browsable API renders its own errors for a browser that asks for HTML."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code >= 400
            and is_api_request(request)
            and not isinstance(response, Response)
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            return api_error_for_status(response.status_code)
        return response


def _render_standalone(template_name: str, fallback: type[HttpResponse], text: str) -> HttpResponse:
    try:
        return fallback(loader.get_template(template_name).render())
    except Exception:  # noqa: BLE001 - an error page must not fail in turn
        logger.exception("rendering %s failed", template_name)
        return fallback(f"<!doctype html><title>{text}</title><h1>{text}</h1>")


def bad_request(request, exception=None):
    if is_api_request(request):
        return api_error(BadRequest())
    return _render_standalone("400.html", HttpResponseBadRequest, "Bad request (400)")


@requires_csrf_token
def permission_denied(request, exception=None):
    message = _message(exception)
    if is_api_request(request):
        return api_error(exceptions.PermissionDenied(message))
    response = loader.render_to_string("403.html", {"message": message}, request)
    return HttpResponse(response, status=403)


@requires_csrf_token
def page_not_found(request, exception=None):
    if is_api_request(request):
        return api_error(exceptions.NotFound(_message(exception)))
    response = loader.render_to_string("404.html", {"request_path": request.path}, request)
    return HttpResponse(response, status=404)


def server_error(request):
    # A database error raised where no view could catch it (a middleware's query, the session's save)
    # is the database being away, not a bug: it gets the 503 of an outage, as a view's would.
    outage = outage_from_exception(sys.exc_info()[1]) if sys.exc_info()[1] is not None else None
    if outage is not None:
        return outage_response(request, outage)
    if is_api_request(request):
        return api_error(ServerError())
    return _render_standalone("500.html", HttpResponseServerError, "Server error (500)")
