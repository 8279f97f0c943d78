"""The runners that spread one run: over N worker processes on this host (`workers`), or
over shards on a Ray cluster (`raycluster`, its Ray-free rules in `cluster`)."""
