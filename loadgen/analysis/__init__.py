"""Analysis: pure functions from records to figures, SLO audits, windows and comparisons."""
