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
