"""Registry services, one module per concern: `artifacts` (ONNX uploads: spool, validate, store, verify),
`profiling` (profiling requests' progress and results, profiling jobs and their targets, automatic
profiling of new variants), `profiles` (the Profile upsert, and importing profiles from CSV or JSON) and
`gpulet` (importing the gpulets reference data: MPS profiles with utilisations, co-run measurements).
Import from the module itself; this package re-exports nothing."""
