"""Workload: the spec, arrivals, traces, prompts, and the plans built from them before t0."""
