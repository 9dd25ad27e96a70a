"""Policies the data plane runs, one implementation for the live runtime, the router and the simulator:
adaptive batching and routing. Rule: no I/O, no clocks of their own; time is passed in."""
