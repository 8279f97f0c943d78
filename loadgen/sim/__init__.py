"""The simulated server (`loadgen sim`): a streaming LLM endpoint in every dialect loadgen
speaks (OpenAI chat/completions and Responses, Anthropic Messages, TGI, Ollama) whose
timing follows the serving model of the project's seed (continuous batching, prefill
rate, batch-dependent decode steps, chunked prefill, a queue cap, disaggregation).

It shares none of the client's request, decoding or timing code, so it can check the
client. Modules: `engine` (the pure step model), `config` (settings), `wire` (what the
dialects share), `openai`, `responses`, `anthropic`, `tgi`, `ollama` (one dialect each),
`dialects` (path → dialect), `faults` (X-Sim-* headers), `protocol` (HTTP/1.1),
`exchange` (one request's bytes and faults), `server` (the event-loop driver and routing),
`trace` (JSON Lines), `cli`, and `launch` (run it as a subprocess).
"""
