"""Results: records, the run folder and the results store on disk."""
