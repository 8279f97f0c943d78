"""Run: one run end to end (plans, target, engine processes, records, summary) in a run folder."""
