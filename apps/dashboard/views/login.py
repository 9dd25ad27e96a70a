"""Sign-in: Django's login view, answering 429 with the wait while the username or the address must wait
(apps/users/services.py, "sign-in throttling")."""
from __future__ import annotations

import math

from django.contrib.auth import views as auth_views

from apps.users.backends import THROTTLED_ATTRIBUTE, request_address
from apps.users.services import login_throttle_wait


class LoginView(auth_views.LoginView):
    redirect_authenticated_user = True

    def form_invalid(self, form):
        if not getattr(self.request, THROTTLED_ATTRIBUTE, False):  # the password was checked: it did not match
            return super().form_invalid(form)
        wait_s = max(1.0, login_throttle_wait(username=str(form.data.get("username", "")), address=request_address(self.request)))
        response = self.render_to_response(self.get_context_data(form=form, throttled_s=math.ceil(wait_s)), status=429)
        response["Retry-After"] = str(math.ceil(wait_s))
        return response


login = LoginView.as_view()
