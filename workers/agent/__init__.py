"""The worker agent: devices, MIG reconciliation, runtimes, metrics."""
