"""Models under a process group: per-rank cost, collectives, gathered reports, sweeps."""
