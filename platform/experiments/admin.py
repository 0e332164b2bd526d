"""The admin's experiments (runs inline), runs and rollout jobs."""

from django.contrib import admin

from experiments.models import Experiment, RolloutJob, Run


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

    def get_readonly_fields(self, request, obj=None):
        """An imported run is read-only here too: every field."""
        if obj is not None and obj.is_imported:
            return [field.name for field in Run._meta.concrete_fields]
        return super().get_readonly_fields(request, obj)


@admin.register(RolloutJob)
class RolloutJobAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "kind", "step", "part", "version", "status", "attempt", "worker", "finished"]
    list_filter = ["kind", "status", "queue"]
    readonly_fields = ["heartbeat", "started", "finished", "worker", "path", "sha256", "result"]
