"""Who sees what: teams, their memberships and invitations, and API tokens. Nobody is in a team
without accepting an invitation (or the admin putting them there); every page and API call sees
only the objects of the caller's teams."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from accounts.mirroring import uri_error


def mirror_uri_validator(value: str) -> None:
    if problem := uri_error(value):
        raise ValidationError(problem, code="mirror_uri")


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    created = models.DateTimeField(auto_now_add=True)
    last_claimed = models.DateTimeField(
        null=True, blank=True, help_text="when a worker last started one of its runs (teams take turns)"
    )
    # Mirroring (`imports.mirror`), off by default; a sweep may set either otherwise for its runs.
    mirror_mlflow_uri = models.CharField(
        "MLflow tracking URI",
        max_length=500,
        blank=True,
        validators=[mirror_uri_validator],
        help_text="every run's config and metrics also sent to this MLflow tracking server "
        "(http(s)://host:port); empty: none",
    )
    mirror_tensorboard = models.BooleanField(
        "TensorBoard files",
        default=False,
        help_text="every run's metrics also written as TensorBoard event files under its folder",
    )

    class Meta:
        ordering = ["name"]
        db_table = "experiments_team"

    def __str__(self) -> str:
        return self.name

    def is_admin(self, user) -> bool:
        return self.memberships.filter(user=user, is_admin=True).exists()


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    is_admin = models.BooleanField(default=False)

    class Meta:
        db_table = "experiments_membership"
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}{' (admin)' if self.is_admin else ''}"


class Invitation(models.Model):
    """A team admin's invitation for a user to join the team: nobody becomes a member of a team
    without accepting one (or through the admin). Superusers are never invited."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_invitations"
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    is_admin = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "experiments_invitation"
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_invitation_per_team")]

    def __str__(self) -> str:
        return f"{self.user} invited to {self.team}{' (admin)' if self.is_admin else ''}"

    @classmethod
    def invite(cls, team: Team, username: str, invited_by, is_admin: bool) -> None:
        """Invite the active account called `username` if there is one that is not a superuser
        and not in the team yet; the caller is never told whether there was."""

        user = (
            get_user_model()
            .objects.filter(username=username, is_active=True, is_superuser=False)
            .exclude(memberships__team=team)
            .first()
        )
        if user is not None:
            cls.objects.update_or_create(
                team=team, user=user, defaults={"invited_by": invited_by, "is_admin": is_admin}
            )

    def accept(self) -> Membership:
        with transaction.atomic():
            membership, _ = Membership.objects.get_or_create(
                team=self.team, user=self.user, defaults={"is_admin": self.is_admin}
            )
            self.delete()
        return membership


class TooManyTokens(Exception):
    """The user has `LAB_MAX_TOKENS_PER_USER` tokens already."""


class ApiToken(models.Model):
    """A bearer token for the API; only its SHA-256 digest is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, help_text="what its owner calls it")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "experiments_apitoken"

    def __str__(self) -> str:
        return f"token {self.name or self.digest[:8] + '…'} of {self.user}"

    @staticmethod
    def _digest(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str = "") -> str:
        """Create a token for `user` and return it; it cannot be shown again. Raises
        `TooManyTokens` when the user has `LAB_MAX_TOKENS_PER_USER` already (checked under the
        user's row lock, so concurrent requests cannot pass it together)."""
        token = secrets.token_urlsafe(32)
        with transaction.atomic():
            get_user_model().objects.select_for_update().filter(pk=user.pk).first()
            cap = settings.LAB_MAX_TOKENS_PER_USER
            if cls.objects.filter(user=user).count() >= cap:
                raise TooManyTokens(
                    f"you have {cap} API tokens, the most a user may have (LAB_MAX_TOKENS_PER_USER); "
                    "revoke one you no longer use"
                )
            cls.objects.create(user=user, name=name, digest=cls._digest(token))
        return token

    @classmethod
    def user_for(cls, token: str):
        """The active user owning `token`, or None."""
        found = (
            cls.objects.select_related("user").filter(digest=cls._digest(token), user__is_active=True).first()
        )
        if found is None:
            return None
        cls.objects.filter(pk=found.pk).update(last_used=timezone.now())
        return found.user
