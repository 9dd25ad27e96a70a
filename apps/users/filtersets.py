import django_filters
from django.contrib.auth import get_user_model

from apps.core.filtersets import TesseraFilterSet

from .models import Token


class TokenFilterSet(TesseraFilterSet):
    class Meta:
        model = Token
        fields = ["user", "write_enabled"]


class UserFilterSet(TesseraFilterSet):
    role = django_filters.CharFilter(field_name="groups__name")

    class Meta:
        model = get_user_model()
        fields = ["username", "is_active"]
