"""loadgen: a client-side load generator and SLO auditor for streaming LLM endpoints."""

__version__ = "0.1.0"
