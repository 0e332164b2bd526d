"""What the dashboards tell the apps above them without importing them: `claim_stated(claim,
verdict)`, sent when a claim is stated, with its verdict then."""

from django.dispatch import Signal

claim_stated = Signal()
