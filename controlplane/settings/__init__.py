"""Settings modules: `local` (embedded defaults), `production` (no defaults for secrets), `test`."""
