from django.contrib import admin

from .models import ObjectChange


@admin.register(ObjectChange)
class ObjectChangeAdmin(admin.ModelAdmin):
    list_display = ["time", "action", "changed_object_type", "object_repr", "actor_name", "source"]
    list_filter = ["action", "actor_kind", "changed_object_type"]
    search_fields = ["object_repr", "actor_name", "changed_object_id"]
    readonly_fields = [f.name for f in ObjectChange._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
