"""Discrete-event simulator and workloads. Rule: the simulator drives `engine.dataplane`'s batching and
routing code, never a copy of it."""
