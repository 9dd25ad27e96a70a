"""Base viewset: every queryset is restricted to what the principal may see for the action, and every
write happens in one transaction (audit rows included)."""
from __future__ import annotations

from django.db import transaction
from rest_framework import viewsets

ACTION_BY_METHOD = {"GET": "view", "HEAD": "view", "OPTIONS": "view", "POST": "add", "PUT": "change", "PATCH": "change", "DELETE": "delete"}


class RestrictedQuerysetMixin:
    queryset = None

    def restrict_action(self) -> str:
        return ACTION_BY_METHOD.get(self.request.method, "view")

    def get_queryset(self):
        qs = super().get_queryset()
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        return qs.restrict(self.request.user, self.restrict_action())


class TesseraModelViewSet(RestrictedQuerysetMixin, viewsets.ModelViewSet):
    def perform_create(self, serializer):
        with transaction.atomic():
            serializer.save()

    def perform_update(self, serializer):
        with transaction.atomic():
            serializer.save()

    def perform_destroy(self, instance):
        with transaction.atomic():
            instance.delete()


class TesseraReadOnlyModelViewSet(RestrictedQuerysetMixin, viewsets.ReadOnlyModelViewSet):
    pass
