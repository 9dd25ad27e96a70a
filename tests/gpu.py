"""Whether this machine has an NVIDIA GPU, asked of the driver (NVML), not of onnxruntime: a GPU test skips only
where no GPU is present, and fails where one is but CUDA does not work (issue 45: a broken CUDA path must not read
as "skipped" on a GPU host)."""
from __future__ import annotations


def gpu_absent_reason() -> str | None:
    """None when NVML answers and counts at least one GPU; else why there is none to test on."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # no driver (NVML library not found), or no device it can open
        return f"no NVIDIA driver answers here (NVML: {exc})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return None if count > 0 else "NVML counts no GPU here"
