"""The team page's form for a new alert target: its kind, its URL or email address, the events it
wants. A webhook URL is checked here (`alerts.addresses.resolve`) and again at each delivery."""

from __future__ import annotations

from django import forms

from alerts import addresses
from alerts.models import EVENTS, Target


class TargetForm(forms.ModelForm):
    url = forms.URLField(
        max_length=2000,
        required=False,
        assume_scheme="https",
        label="URL",
        help_text="a Slack-compatible or generic webhook's URL (http or https, a public address)",
    )
    events = forms.MultipleChoiceField(
        choices=list(EVENTS.items()),
        widget=forms.CheckboxSelectMultiple,
        help_text="the events sent to this target",
    )

    class Meta:
        model = Target
        fields = ["kind", "url", "email", "events"]
        help_texts = {"email": "for an email target"}

    def clean(self) -> dict:
        data = super().clean()
        kind, url, email = data.get("kind"), data.get("url"), data.get("email")
        if kind == Target.EMAIL:
            if not email and "email" not in self.errors:
                self.add_error("email", "an email target needs an email address")
            data["url"] = ""
        elif kind in (Target.SLACK, Target.WEBHOOK):
            if url:
                try:
                    addresses.resolve(url)
                except addresses.AddressRefused as exc:
                    self.add_error("url", str(exc))
            elif "url" not in self.errors:
                self.add_error("url", f"a {kind} target needs the webhook's URL")
            data["email"] = ""
        return data
