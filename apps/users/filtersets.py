import django_filters
from django.contrib.auth import get_user_model

from .models import Token


class TokenFilterSet(django_filters.FilterSet):
    class Meta:
        model = Token
        fields = ["user", "write_enabled"]


class UserFilterSet(django_filters.FilterSet):
    role = django_filters.CharFilter(field_name="groups__name")

    class Meta:
        model = get_user_model()
        fields = ["username", "is_active"]
