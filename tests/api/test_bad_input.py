"""Malformed input gets a 4xx JSON error naming the field, never a 500; an unexpected error under /api/ is
JSON even with DEBUG on (the demo's local settings); the OpenAPI schema says where the API answers null.
Each case is one a schemathesis run against the demo found (tests/api/test_schema_fuzz.py runs it in CI)."""
import django_filters
import pytest
from rest_framework.test import APIClient

from apps.core.filtersets import TesseraFilterSet
from apps.deployments.models import HostDesiredState
from apps.inventory.api.views import HostViewSet
from apps.registry.models import Profile
from controlplane.urls import urlpatterns
from tests.api.test_deployments import fleet, mig_runtime  # noqa: F401 - the fixture, and a valid runtime
from tests.api.test_schema_fuzz import openapi_schema
from tests.factories import ModelVariantFactory

pytestmark = pytest.mark.django_db

PAST_64_BITS = str(2**64 + 1)


def _invalid(response, field: str) -> dict:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["fields"], error
    return error


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize("path,field", [("/api/v1/gpu-instances/", "host"), ("/api/v1/profiling-requests/", "application")])
def test_a_number_filter_past_64_bits_is_a_400_naming_it(clients, path, field):
    error = _invalid(clients["operator"].get(path, {field: PAST_64_BITS}), field)
    assert "less than or equal to" in str(error["fields"][field])


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def _api_filtersets() -> set[type]:
    """The filterset of every API view (the URLconf's views, by their filterset_class)."""
    found = set()

    def walk(patterns):
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                walk(pattern.url_patterns)
                continue
            view_class = getattr(pattern.callback, "cls", None)
            filterset = getattr(view_class, "filterset_class", None)
            if filterset is not None:
                found.add(filterset)

    walk(urlpatterns)
    return found


def test_every_api_filterset_bounds_its_integer_filters():
    filtersets = _api_filtersets()
    assert len(filtersets) > 20
    assert all(issubclass(f, TesseraFilterSet) for f in filtersets), [f for f in filtersets if not issubclass(f, TesseraFilterSet)]
    checked = 0
    for filterset in filtersets:
        for name, filter_ in filterset.base_filters.items():
            if not isinstance(filter_, django_filters.NumberFilter) or "max_value" not in filter_.extra:
                continue
            form = filterset({name: PAST_64_BITS}, queryset=filterset._meta.model.objects.all()).form
            assert not form.is_valid() and name in form.errors, (filterset, name)
            checked += 1
    assert checked >= 10


def test_a_number_filter_on_a_float_keeps_any_number(clients):
    variant = ModelVariantFactory(accuracy=0.9)
    body = clients["viewer"].get("/api/v1/variants/", {"accuracy_min": "0.5"}).json()
    assert [v["id"] for v in body["results"]] == [variant.pk]
    assert clients["viewer"].get("/api/v1/variants/", {"accuracy_min": PAST_64_BITS}).json()["count"] == 0


# --------------------------------------------------------------------------- desired state


@pytest.mark.parametrize("override", [
    pytest.param({"application": {"name": "classify"}}, id="application an object"),
    pytest.param({"application": ["classify"]}, id="application a list"),
    pytest.param({"variant": 2**64 + 1}, id="variant past 64 bits"),
])
def test_a_malformed_desired_runtime_is_a_400_and_stores_nothing(clients, fleet, override):  # noqa: F811
    spec = {"runtimes": [mig_runtime(fleet, **override)]}
    error = _invalid(clients["operator"].post(f"/api/v1/hosts/{fleet.host.pk}/desired-state/", spec, format="json"), "runtimes")
    assert "runtimes[0]" in str(error["fields"]["runtimes"])
    assert not HostDesiredState.objects.exists()


# --------------------------------------------------------------------------- profile import


def _import_csv(client, body: bytes):
    return client.generic("POST", "/api/v1/profiles/import/", body, content_type="text/csv")


def test_a_csv_with_carriage_return_line_ends_is_read(clients):
    variant = ModelVariantFactory(name="resnet50")
    text = f"variant,device_type,slice,batch_size,latency_p50_ms,latency_p99_ms\r{variant.pk},A100-SXM4-40GB,full,1,3,4\r"
    response = _import_csv(clients["operator"], text.encode())
    assert response.status_code == 200, response.content
    assert response.json() == {"created": 1, "updated": 0} and Profile.objects.get().variant == variant


def test_a_body_the_csv_module_cannot_read_is_a_400_naming_its_line(clients):
    # A quoted field left open runs past the csv module's field size limit (128 KiB).
    body = b"variant,device_type,slice,batch_size,latency_p50_ms,latency_p99_ms\n\"" + b"x" * 200_000
    error = _invalid(_import_csv(clients["operator"], body), "line 2")
    assert "CSV" in error["message"] and not Profile.objects.exists()


# --------------------------------------------------------------------------- unexpected errors


def test_an_unexpected_error_in_an_api_view_is_json_with_debug_on(clients, settings, monkeypatch):
    settings.DEBUG = True  # local settings, which the demo runs: Django would answer with its HTML debug page

    def boom(self):
        raise RuntimeError("boom: internals")

    monkeypatch.setattr(HostViewSet, "get_queryset", boom)
    client = APIClient(raise_request_exception=False)
    client.credentials(**clients["operator"]._credentials)
    response = client.get("/api/v1/hosts/")
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert response.json() == {"error": {"status": 500, "code": "server_error", "message": "A server error occurred."}}
    missing = client.get("/api/v1/no-such-endpoint/")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


# --------------------------------------------------------------------------- the schema


def test_the_schema_says_which_user_fields_may_be_null():
    components = openapi_schema()["components"]["schemas"]
    for component, field in [("Job", "actor"), ("Plan", "created_by"), ("Plan", "approved_by"), ("PlanList", "created_by"),
                             ("PlanList", "approved_by"), ("HostDesiredState", "created_by"), ("ProfilingRequest", "created_by")]:
        assert components[component]["properties"][field].get("nullable") is True, (component, field)
        assert "Required." not in components[component]["properties"][field].get("description", "")



@pytest.mark.parametrize("value", ["0819-12-18T22:17:59-20:58", "2026-01-01T00:00:00+23:59"])
def test_a_date_time_filter_takes_any_iso_offset(clients, value):
    # PostgreSQL refuses offsets past ±15:59 (a DataError, once a 500); the filter compares in UTC.
    assert clients["viewer"].get("/api/v1/object-changes/", {"time_after": value}).status_code == 200


def test_a_date_time_filter_before_year_1_in_utc_is_a_400_naming_it(clients):
    _invalid(clients["viewer"].get("/api/v1/object-changes/", {"time_after": "0001-01-01T00:00:00+05:00"}), "time_after")
