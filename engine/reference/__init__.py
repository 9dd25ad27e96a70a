"""Reference data and synthetic problems: profiles derived from `engine/reference/data`, problem generators for the
demo, tests and benchmarks. Rule: every derived number is labelled as derived, never as measured."""
