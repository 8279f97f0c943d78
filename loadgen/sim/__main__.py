"""`python -m loadgen.sim ...`: the same command as `loadgen sim` (used by `running_sim`)."""

from loadgen.sim.cli import sim

if __name__ == "__main__":
    sim(prog_name="loadgen sim")
