"""`python -m loadgen` is the `loadgen` command."""

from loadgen.cli import main

main()
