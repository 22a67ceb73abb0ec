"""Models under a process group: what profile() does there, gathered reports, sweeps."""
