"""`{% alerts_section %}`: the alerts section of the team page (`accounts/team.html`, for its
admins), drawn by alerts itself so that accounts needs to know nothing of it."""

from __future__ import annotations

from django import template

from alerts.views import section

register = template.Library()


@register.inclusion_tag("alerts/_section.html", takes_context=True)
def alerts_section(context) -> dict:
    team = context["team"]
    return {"team": team, **section(team)}
