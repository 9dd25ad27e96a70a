from django.urls import path
from rest_framework.routers import SimpleRouter

from .views import ObjectChangeViewSet, api_root

router = SimpleRouter()
router.register("object-changes", ObjectChangeViewSet, basename="objectchange")

urlpatterns = [path("", api_root, name="api-root"), *router.urls]
