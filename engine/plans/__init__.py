"""Problem and plan values, their JSON schema, the capacity model and the plan validator. Rule: imports
only `engine.geometry`; the validator re-derives everything without solver code."""
