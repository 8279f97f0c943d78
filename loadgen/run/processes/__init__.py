"""The processes a run starts besides its own, each a `child.Child` (start, ready, start-at,
stop, lifeline): the engine workers' group (`group`), the server-metrics scraper
(`scraper`), the built-in simulator (`simulator`); a command's side of the start
(`told`) and how every child dies with its parent (`lifeline`)."""
