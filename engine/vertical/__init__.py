"""Vertical scaling on CPU hosts (Razavi's thesis, parts P2 Sponge and P4 Biscale): a running instance's
cores resized in place instead of adding instances."""
