"""The admin: teams with their members inline, invitations, experiments, runs, rollout jobs and
API tokens."""

from django import forms
from django.contrib import admin

from experiments.forms import AdminLoginForm
from experiments.models import ApiToken, Experiment, Invitation, Membership, RolloutJob, Run, Team

# The admin's login is rate-limited like the site's (experiments.throttle) and says so.
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


class RunInline(admin.TabularInline):
    model = Run
    extra = 0
    fields = ["preset", "staleness", "seed", "status", "attempt", "progress", "worker"]
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "owner", "created", "archived"]
    list_filter = ["team", "archived"]
    search_fields = ["name", "description"]
    inlines = [RunInline]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "experiment",
        "preset",
        "staleness",
        "seed",
        "status",
        "attempt",
        "progress",
        "worker",
    ]
    list_filter = ["status", "queue", "preset"]
    readonly_fields = ["key", "heartbeat", "started", "finished", "worker"]


@admin.register(RolloutJob)
class RolloutJobAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "kind", "step", "part", "version", "status", "attempt", "worker", "finished"]
    list_filter = ["kind", "status", "queue"]
    readonly_fields = ["heartbeat", "started", "finished", "worker", "path", "sha256", "result"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "created", "last_used"]
    readonly_fields = ["digest", "created", "last_used"]
