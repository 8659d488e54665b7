"""Media the host decodes before a model sees it: recorded audio (`audio.py`) and chat images (`image.py`)."""
