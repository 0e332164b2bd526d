"""`THROUGHPUT_COLUMNS` where `dashboards.export` imports it from until export.py moves (issue 37):
the comparison lives in `dashboards.comparison`."""

from __future__ import annotations

from dashboards.comparison.compare import THROUGHPUT_COLUMNS

__all__ = ["THROUGHPUT_COLUMNS"]
