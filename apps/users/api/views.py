from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status, viewsets
from rest_framework.response import Response

from apps.core.api.throttling import TokenCreateThrottle
from apps.core.api.viewsets import TesseraModelViewSet

from ..filtersets import TokenFilterSet, UserFilterSet
from ..models import Token
from ..services import token_create, user_create, user_update
from .serializers import TokenCreatedSerializer, TokenSerializer, UserSerializer

User = get_user_model()


class UserViewSet(viewsets.ModelViewSet):
    """Accounts and their role (admin only)."""

    queryset = User.objects.prefetch_related("groups").order_by("username")
    serializer_class = UserSerializer
    filterset_class = UserFilterSet
    ordering_fields = ["username", "date_joined"]

    def perform_create(self, serializer):
        data = dict(serializer.validated_data)
        serializer.instance = user_create(
            username=data.pop("username"), password=data.pop("password", None), role=data.pop("role", None), **data
        )

    def perform_update(self, serializer):
        data = dict(serializer.validated_data)
        serializer.instance = user_update(
            user=serializer.instance, role=data.pop("role", None), password=data.pop("password", None), **data
        )


class TokenViewSet(TesseraModelViewSet):
    """API tokens. Everyone manages their own; admins manage everyone's. The secret is returned once, on
    creation."""

    queryset = Token.objects.select_related("user")
    serializer_class = TokenSerializer
    filterset_class = TokenFilterSet
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    throttle_classes = [TokenCreateThrottle]  # creating: at most REST_FRAMEWORK's `token_create` rate per user

    @extend_schema(responses={201: TokenCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        owner = data.pop("user", None) or request.user
        if owner != request.user and not request.user.has_perm("auth.change_user"):
            raise exceptions.PermissionDenied("Only admins may create tokens for other users.")
        token, secret = token_create(user=owner, **data)
        out = TokenCreatedSerializer(token, context={**self.get_serializer_context(), "secret": secret})
        return Response(out.data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer):
        if "user" in serializer.validated_data and serializer.validated_data["user"] != serializer.instance.user:
            raise exceptions.ValidationError({"user": ["A token cannot be moved to another user."]})
        super().perform_update(serializer)
