"""Run: one run end to end (plans, target, engine processes, records, summary) in a run folder.

`execute` is the entry: it checks the run (`prepare`), chooses once how its plans are sent
(a `context.Runner`: `local`, `scale.workers`, `scale.raycluster.driver`) and runs it with
one `context.RunContext`. Below the runners: what a run on this host shares (`host`), one
engine process's loop (`drive`), the records' consumers (`outputs`) and the processes a
run starts (`processes`). The layers are a contract in pyproject.toml.
"""
