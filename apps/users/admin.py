from django.contrib import admin

from .models import ApiAuthFailure, LoginFailure, Token


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin):
    list_display = ["display_prefix", "user", "description", "write_enabled", "expires", "last_used", "created"]
    list_filter = ["write_enabled"]
    search_fields = ["user__username", "description", "display_prefix"]
    readonly_fields = ["display_prefix", "last_used"]

    def has_add_permission(self, request):
        return False  # the secret must be shown once: create tokens through the API or `tessera token create`


class _ThrottleRecordAdmin(admin.ModelAdmin):
    """What a throttle counts: read-only (deleting a row forgives that failure)."""

    date_hierarchy = "created"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(LoginFailure)
class LoginFailureAdmin(_ThrottleRecordAdmin):
    """Failed password sign-ins, as the throttle counts them."""

    list_display = ["username", "address", "created"]
    search_fields = ["username", "address"]


@admin.register(ApiAuthFailure)
class ApiAuthFailureAdmin(_ThrottleRecordAdmin):
    """Bearer secrets the API refused, by address, as the throttle counts them."""

    list_display = ["address", "kind", "created"]
    list_filter = ["kind"]
    search_fields = ["address"]
