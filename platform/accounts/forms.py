"""Forms of accounts: log in (rate-limited), create a team, invite a member, name a token. A
CharField refuses NUL characters by itself (Django's ProhibitNullCharactersValidator)."""

from __future__ import annotations

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from accounts import throttle
from accounts.models import Team


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = ["name"]


class TeamMirrorForm(forms.ModelForm):
    """Where the team's runs are mirrored (`imports.mirror`); a sweep may say otherwise for its own."""

    class Meta:
        model = Team
        fields = ["mirror_mlflow_uri", "mirror_tensorboard"]


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, label="Name", help_text="what the token is for, e.g. laptop or CI", strip=True
    )


class InviteForm(forms.Form):
    username = forms.CharField(max_length=150)
    is_admin = forms.BooleanField(required=False, label="team admin")


class ThrottledLoginMixin:
    """A login refused by the rate limits (accounts.throttle) says so, and for how long,
    instead of blaming the password; its error code is `throttled`."""

    def get_invalid_login_error(self):
        seconds = getattr(self.request, "login_retry_after", None)
        if seconds is not None:
            return forms.ValidationError(throttle.refusal("logins", seconds), code="throttled")
        return super().get_invalid_login_error()


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass
