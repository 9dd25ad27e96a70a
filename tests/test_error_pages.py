"""The project-wide templates and assets: error pages in the product's look for browser paths and the API's
one JSON error shape under /api/ (controlplane/errors.py, wired as handler400/403/404/500), the page shell
(templates/base.html) with its logo and favicon, and static/ found by the finders and by collectstatic
under production settings. Test settings run with DEBUG=False, so Django calls the real handlers."""
import json
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db import OperationalError
from django.http import Http404
from django.test import Client, RequestFactory
from django.urls import path

from controlplane import errors
from controlplane.urls import handler400, handler403, handler404, handler500  # noqa: F401 - this URLconf's handlers
from controlplane.urls import urlpatterns as project_urlpatterns

REPO = Path(__file__).resolve().parent.parent
ERROR_KEYS = {"status", "code", "message"}


# --- a URLconf of the project's patterns plus views that fail (used with @pytest.mark.urls(__name__)) ---

def _boom(request):
    raise RuntimeError("boom")


def _forbidden(request):
    raise PermissionDenied("Operators only.")


def _suspicious(request):
    raise SuspiciousOperation("tampered")


def _missing(request):
    raise Http404("No Host matches the given query.")


def _database_down(request):
    raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: Connection refused')


urlpatterns = [
    path("api/v1/test-boom/", _boom),
    path("api/v1/test-forbidden/", _forbidden),
    path("api/v1/test-suspicious/", _suspicious),
    path("api/v1/test-missing/", _missing),
    path("api/v1/test-database-down/", _database_down),
    path("test-database-down/", _database_down),
    path("test-boom/", _boom),
    path("test-forbidden/", _forbidden),
    path("test-suspicious/", _suspicious),
    *project_urlpatterns,
]

errors_urlconf = pytest.mark.urls(__name__)


def _error(response, status: int, code: str) -> dict:
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS
    assert body["error"]["status"] == status and body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


# --- handlers wired -----------------------------------------------------------------------------------

def test_the_project_urlconf_names_the_error_views():
    from django.urls import get_resolver

    resolver = get_resolver("controlplane.urls")
    assert resolver.resolve_error_handler(400) is errors.bad_request
    assert resolver.resolve_error_handler(403) is errors.permission_denied
    assert resolver.resolve_error_handler(404) is errors.page_not_found
    assert resolver.resolve_error_handler(500) is errors.server_error


# --- browser paths: HTML pages ------------------------------------------------------------------------

@pytest.mark.django_db
def test_404_on_a_browser_path_renders_the_html_page(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "Page not found" in html and "<code>/no-such-page/</code>" in html
    assert 'class="topbar"' in html and "/static/img/logo.svg" in html and "/static/img/favicon.svg" in html
    assert "/static/css/tessera.css" in html
    assert 'class="nav"' not in html  # nobody is signed in: no navigation, no log-out


@pytest.mark.django_db
def test_404_shows_the_navigation_to_a_signed_in_user(client, users):
    client.force_login(users["viewer"])
    html = client.get("/no-such-page/").content.decode()
    assert 'class="nav"' in html and '<form class="logout"' in html and 'name="csrfmiddlewaretoken"' in html


@pytest.mark.django_db
@errors_urlconf
def test_403_on_a_browser_path_renders_the_html_page(client):
    response = client.get("/test-forbidden/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "Forbidden" in html and "Operators only." in html and 'class="topbar"' in html


@errors_urlconf
def test_500_on_a_browser_path_renders_the_standalone_page_without_the_database():
    # No django_db mark: any query while rendering would fail the test.
    response = Client(raise_request_exception=False).get("/test-boom/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong" in html and "500" in html and "<style>" in html
    assert "{%" not in html and "/static/img/favicon.svg" in html


@errors_urlconf
def test_400_on_a_browser_path_renders_the_standalone_page():
    response = Client(raise_request_exception=False).get("/test-suspicious/")
    assert response.status_code == 400
    assert "Bad request" in response.content.decode()


def test_the_500_handler_renders_without_a_request_context_or_database():
    response = errors.server_error(RequestFactory().get("/overview/"))
    assert response.status_code == 500 and b"Something went wrong" in response.content
    response = errors.server_error(RequestFactory().get("/api/v1/hosts/"))
    assert _error(response, 500, "server_error")["message"] == "A server error occurred."


@pytest.mark.django_db
def test_a_csrf_failure_renders_the_standalone_page():
    response = Client(enforce_csrf_checks=True).post("/login/", {"username": "x", "password": "y"})
    assert response.status_code == 403
    html = response.content.decode()
    assert "Form expired" in html and "<style>" in html


# --- API paths: the JSON error shape ------------------------------------------------------------------

@pytest.mark.django_db
def test_404_under_the_api_answers_json(client):
    assert _error(client.get("/api/v1/no-such-endpoint/"), 404, "not_found")["message"] == "Not found."
    assert _error(client.get("/api/no-version/"), 404, "not_found")


@pytest.mark.django_db
@errors_urlconf
def test_404_403_400_raised_under_the_api_answer_json(client):
    missing = _error(client.get("/api/v1/test-missing/"), 404, "not_found")
    assert missing["message"] == "No Host matches the given query."
    assert _error(client.get("/api/v1/test-forbidden/"), 403, "permission_denied")["message"] == "Operators only."
    assert _error(client.get("/api/v1/test-suspicious/"), 400, "bad_request")["message"] == "Bad request."


@errors_urlconf
def test_500_under_the_api_answers_json():
    response = Client(raise_request_exception=False).get("/api/v1/test-boom/")
    error = _error(response, 500, "server_error")
    assert "boom" not in error["message"]  # no internals leak


@errors_urlconf
def test_the_database_away_answers_503_json_under_the_api_and_the_unavailable_page_elsewhere(settings):
    # No django_db mark: neither answer may touch the database. (Outages on real services:
    # tests/integration/test_outages.py.)
    client = Client(raise_request_exception=False)
    response = client.get("/api/v1/test-database-down/")
    error = _error(response, 503, "service_unavailable")
    assert "database" in error["message"].lower() and response["Retry-After"] == str(settings.TESSERA_RETRY_AFTER_S)
    assert "5432" not in error["message"]  # no addresses leak
    response = client.get("/test-database-down/")
    assert response.status_code == 503 and response["Content-Type"].startswith("text/html") and response["Retry-After"]
    html = response.content.decode()
    assert "Database unavailable" in html and "Nothing was changed" in html and "<style>" in html and "{%" not in html


class _DatabaseDownMiddleware:
    """A middleware whose query fails: the exception reaches Django's handler500, not OutageMiddleware."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        _database_down(request)


def test_a_database_error_raised_in_a_middleware_answers_503_not_500(settings):
    settings.MIDDLEWARE = ["controlplane.errors.ApiErrorsAsJsonMiddleware", f"{__name__}._DatabaseDownMiddleware"]
    client = Client(raise_request_exception=False)
    error = _error(client.get("/api/v1/hosts/"), 503, "service_unavailable")
    assert "database" in error["message"].lower()
    response = client.get("/login/")
    assert response.status_code == 503 and "Database unavailable" in response.content.decode()


@pytest.mark.django_db
def test_api_views_keep_their_own_json_errors(client):
    # The REST framework's handler answers inside API views; the same shape either way.
    assert _error(client.get("/api/v1/hosts/"), 401, "not_authenticated")


# --- the page shell, login and static assets ----------------------------------------------------------

@pytest.mark.django_db
def test_login_page_uses_the_project_shell(client):
    html = client.get("/login/").content.decode()
    assert "<h1>Log in</h1>" in html and 'action="/login/"' in html
    assert "/static/img/logo.svg" in html and "/static/img/favicon.svg" in html and "/static/css/tessera.css" in html
    assert "dashboard.css" not in html and "live.js" not in html  # the dashboard's own assets stay on its pages


@pytest.mark.parametrize("name", [
    "img/favicon.svg", "img/logo.svg", "css/tessera.css",
    "vendor/uplot-1.6.32/uPlot.iife.min.js", "vendor/uplot-1.6.32/uPlot.min.css", "vendor/uplot-1.6.32/LICENSE",
])
def test_project_assets_are_found_by_the_static_finders(name):
    found = finders.find(name)
    assert found and Path(found).is_relative_to(REPO / "static")


def test_the_vendored_library_keeps_its_licence():
    licence = (REPO / "static/vendor/uplot-1.6.32/LICENSE").read_text()
    assert "MIT License" in licence and "Leon Sorokin" in licence


def test_the_dashboard_no_longer_carries_the_vendored_copy():
    assert finders.find("dashboard/vendor/uplot-1.6.32/uPlot.iife.min.js") is None


@pytest.mark.django_db
def test_favicon_and_logo_are_served(client, settings):
    settings.WHITENOISE_USE_FINDERS = True  # as under DEBUG; production serves the collected copies
    for url in ("/static/img/favicon.svg", "/static/img/logo.svg"):
        response = client.get(url)
        assert response.status_code == 200 and response["Content-Type"].startswith("image/svg+xml"), url
        assert b"<svg" in b"".join(response.streaming_content)
    response = client.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == "/static/img/favicon.svg"


@pytest.mark.django_db
@errors_urlconf
def test_api_errors_answer_json_with_debug_on_too(settings):
    # Local settings (the demo) run with DEBUG on: Django then answers with its HTML debug pages instead of
    # calling the handlers, and ApiErrorsAsJsonMiddleware turns those into the API's JSON under /api/.
    settings.DEBUG = True
    client = Client(raise_request_exception=False)
    error = _error(client.get("/api/v1/test-boom/"), 500, "server_error")
    assert "boom" not in error["message"] and "Traceback" not in error["message"]
    _error(client.get("/api/v1/no-such-endpoint/"), 404, "not_found")
    _error(client.get("/api/v1/test-missing/"), 404, "not_found")
    _error(client.get("/api/v1/test-suspicious/"), 400, "bad_request")
    _error(client.get("/api/v1/test-forbidden/"), 403, "permission_denied")
    # Browser paths keep Django's debug pages.
    assert client.get("/test-boom/")["Content-Type"].startswith("text/html")
