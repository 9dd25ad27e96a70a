from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import TesseraModelSerializer

from ..choices import RoleChoices
from ..models import Token
from ..roles import user_role

User = get_user_model()


class UserSerializer(serializers.ModelSerializer):
    role = serializers.ChoiceField(choices=RoleChoices.choices, required=False, allow_null=True)
    password = serializers.CharField(write_only=True, required=False, allow_blank=False, style={"input_type": "password"})

    class Meta:
        model = User
        fields = ["id", "username", "email", "is_active", "role", "password", "date_joined", "last_login"]
        read_only_fields = ["date_joined", "last_login"]

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["role"] = user_role(instance)
        return data

    def validate_password(self, value):
        validate_password(value)
        return value


class TokenSerializer(TesseraModelSerializer):
    user = serializers.PrimaryKeyRelatedField(queryset=User.objects.all(), required=False)

    class Meta:
        model = Token
        fields = ["id", "display", "user", "display_prefix", "description", "write_enabled", "expires", "last_used", "created"]
        read_only_fields = ["display_prefix", "last_used", "created"]

    def validate(self, attrs):
        # The owner defaults to the caller and the secret's hash is made by token_create; nothing in the
        # model's own validation applies before that.
        return attrs


class TokenCreatedSerializer(TokenSerializer):
    key = serializers.SerializerMethodField()

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key"]

    @extend_schema_field(serializers.CharField(help_text="The secret. Shown once, in this response only."))
    def get_key(self, obj) -> str:
        return self.context["secret"]
