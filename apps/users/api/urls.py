from rest_framework.routers import SimpleRouter

from .views import TokenViewSet, UserViewSet

router = SimpleRouter()
router.register("users", UserViewSet, basename="user")
router.register("tokens", TokenViewSet, basename="token")
urlpatterns = router.urls
