"""Studies built from runs: capacity search, client calibration, capacity planning."""
