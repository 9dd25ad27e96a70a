"""The project's error views (handler400/403/404/500 in controlplane/urls.py). Django calls them when a
request fails outside the REST framework's own handling: an address that matches no URL, an exception no
view caught, a refused permission in a plain Django view. A path under /api/ gets JSON of the API's one
error shape (apps/core/api/exceptions.py: {"error": {"status": 404, "code": "not_found", "message": ...}}),
so CI scripts read the same body whether the router or a view refused; any other path gets the HTML page
(templates/400.html ... 500.html).

The 400 and 500 pages are rendered without the request (no context processors, no session, no database):
a 500 may come from the database being down. 403 and 404 render with the request, in the page shell."""
from __future__ import annotations

import logging

from django.http import HttpResponse, HttpResponseBadRequest, HttpResponseServerError, JsonResponse
from django.template import loader
from django.views.decorators.csrf import requires_csrf_token
from rest_framework import exceptions

from apps.core.api.exceptions import tessera_exception_handler

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
    if is_api_request(request):
        return api_error(ServerError())
    return _render_standalone("500.html", HttpResponseServerError, "Server error (500)")
