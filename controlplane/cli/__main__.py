"""`python -m controlplane.cli`: the `tessera` command without its console script (the demo starts agents so)."""
from controlplane.cli import app

if __name__ == "__main__":
    app()
