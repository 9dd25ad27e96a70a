from django.db import models


class TaskChoices(models.TextChoices):
    IMAGE_CLASSIFICATION = "image-classification", "Image classification"
    OBJECT_DETECTION = "object-detection", "Object detection"
    TEXT_CLASSIFICATION = "text-classification", "Text classification"
    QUESTION_ANSWERING = "question-answering", "Question answering"
    SPEECH_RECOGNITION = "speech-recognition", "Speech recognition"
    TRANSLATION = "translation", "Translation"
    OTHER = "other", "Other"


class ProfileSourceChoices(models.TextChoices):
    MEASURED = "measured", "Measured by a Tessera profiler"
    IMPORTED = "imported", "Imported"


CPU_DEVICE_TYPE = "cpu"
FULL_SLICE = "full"


class ProfilingStatusChoices(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


PROFILING_FINISHED = (ProfilingStatusChoices.SUCCEEDED, ProfilingStatusChoices.FAILED)
PROFILING_BATCH_SIZES_DEFAULT = (1, 2, 4, 8, 16, 32, 64)
PROFILING_CPU_THREADS_DEFAULT = (1, 2, 4)  # capped at the CPU's cores
PROFILING_BATCH_SIZE_MAX = 4096

# What the profiler feeds a string (BYTES) input: words of this many characters unless a request says otherwise
# (workers/profiler.py, DEFAULT_STRING_LENGTH).
PROFILING_STRING_LENGTH_DEFAULT = 16
PROFILING_STRING_LENGTH_MAX = 65536
