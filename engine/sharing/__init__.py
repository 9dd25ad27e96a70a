"""Spatio-temporal GPU sharing (gpulets, ATC'22): MPS partitions of a GPU, latency under a partition, and
the slowdown two models co-located on one GPU cause each other (`interference`)."""
