"""The admin's teams (members inline), invitations and API tokens, and its login, rate-limited like
the site's (`accounts.throttle`) and saying so."""

from django import forms
from django.contrib import admin

from accounts.forms import AdminLoginForm
from accounts.models import ApiToken, Invitation, Membership, Team

admin.site.login_form = AdminLoginForm


class MembershipForm(forms.ModelForm):
    """A membership row of the admin: staff never put a superuser into a team (teams by consent:
    a superuser joins by accepting an invitation, or adds themselves)."""

    request_user = None  # the admin user of this request (MembershipInline.get_formset)

    def clean_user(self):
        user = self.cleaned_data["user"]
        added = self.instance.pk is None or self.instance.user_id != user.pk
        if added and user.is_superuser and user != self.request_user:
            raise forms.ValidationError(
                "user: a superuser is never added to a team by someone else; they join by accepting "
                "an invitation or add themselves"
            )
        return user


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 1
    autocomplete_fields = ["user"]

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = type(formset.form.__name__, (formset.form,), {"request_user": request.user})
        return formset


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "is_admin", "invited_by", "created"]
    list_select_related = ["team", "user", "invited_by"]
    raw_id_fields = ["team", "user", "invited_by"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "created", "last_used"]
    readonly_fields = ["digest", "created", "last_used"]
