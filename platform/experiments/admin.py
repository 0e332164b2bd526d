"""The admin: teams with their members inline, invitations, experiments, runs, rollout jobs and
API tokens."""

from django.contrib import admin

from experiments.forms import AdminLoginForm
from experiments.models import ApiToken, Experiment, Invitation, Membership, RolloutJob, Run, Team

# The admin's login is rate-limited like the site's (experiments.throttle) and says so.
admin.site.login_form = AdminLoginForm


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


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
    list_display = ["id", "run", "step", "part", "version", "status", "attempt", "worker", "finished"]
    list_filter = ["status", "queue"]
    readonly_fields = ["heartbeat", "started", "finished", "worker", "path", "sha256"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "created", "last_used"]
    readonly_fields = ["digest", "created", "last_used"]
