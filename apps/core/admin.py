from django.contrib import admin

from .models import ObjectChange


class ReadOnlyAdmin(admin.ModelAdmin):
    """The admin of rows that services, agents or the audit signals write: it shows them, every field
    read-only, and never adds or changes one by hand. Django's view permission does the rest (without the
    change permission its change page is a read-only view). Deleting stays the model's delete permission,
    as in any ModelAdmin, unless `deletable` is False (rows no one deletes by hand: the audit log, plans)."""

    deletable = True

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return self.deletable and super().has_delete_permission(request, obj)


@admin.register(ObjectChange)
class ObjectChangeAdmin(ReadOnlyAdmin):
    list_display = ["time", "action", "changed_object_type", "object_repr", "actor_name", "source"]
    list_filter = ["action", "actor_kind", "changed_object_type"]
    search_fields = ["object_repr", "actor_name", "changed_object_id"]
    deletable = False
