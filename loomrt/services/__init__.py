"""One batching service per modality, all on the `StageService` skeleton of `base.py`."""
