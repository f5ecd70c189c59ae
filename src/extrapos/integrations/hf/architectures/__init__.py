"""One module per Hugging Face architecture family; each registers its adapters (see ../registry.py)."""
