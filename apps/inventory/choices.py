from django.db import models


class HostStatusChoices(models.TextChoices):
    REGISTERED = "registered", "Registered"  # known, its agent has not reported yet
    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"
    MAINTENANCE = "maintenance", "Maintenance"  # planners leave it out


class HostBackendChoices(models.TextChoices):
    NVML = "nvml", "NVML (real GPUs)"
    SIMULATED = "simulated", "Simulated"


class AcceleratorKindChoices(models.TextChoices):
    GPU = "gpu", "GPU"
    CPU = "cpu", "CPU"


class GpuInstanceStateChoices(models.TextChoices):
    PENDING = "pending", "Pending"  # desired, not yet created on the GPU
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    FAILED = "failed", "Failed"


# An MPS partition's life is a GPU instance's: desired (pending), running (ready), draining, failed.
MpsPartitionStateChoices = GpuInstanceStateChoices
