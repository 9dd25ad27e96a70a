"""The data plane that runs on GPU hosts: the worker agent, the onnxruntime runtimes and the router.

Nothing here imports Django or the control plane (an import-linter contract in pyproject.toml keeps it
so): agents talk to the control plane only through its REST API with their host's agent token, and keep
serving when it is away."""
