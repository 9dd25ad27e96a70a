"""Registry services, one module per concern: `artifacts` (ONNX uploads: spool, validate, store, verify),
`profiling` (profiling requests' progress and results, profiling jobs and their targets, automatic
profiling of new variants) and `profiles` (the Profile upsert, and importing profiles from CSV or JSON).
Import from the module itself; this package re-exports nothing."""
