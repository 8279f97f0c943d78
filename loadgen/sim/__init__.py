"""The simulated server (`loadgen sim`): an OpenAI-compatible streaming endpoint whose
timing follows the serving model of the project's seed (continuous batching, prefill
rate, batch-dependent decode steps, chunked prefill, a queue cap, disaggregation).

It shares none of the client's request, decoding or timing code, so it can check the
client. Modules: `engine` (the pure step model), `config` (settings), `openai` (wire
format), `faults` (X-Sim-* headers), `protocol` (HTTP/1.1), `server` (the event-loop
driver), `trace` (JSON Lines), `cli`, and `launch` (run it as a subprocess).
"""
