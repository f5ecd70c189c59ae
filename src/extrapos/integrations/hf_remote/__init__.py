"""Any extrapos run as a Hugging Face model folder that ``transformers`` loads with its Auto classes
(``extrapos export RUN --format remote-code``; docs/huggingface.md).

A native architecture (GPT-2, GPT-NeoX, Llama, Qwen2, Bloom; ``integrations/hf/``) holds only the
encodings Hugging Face has. This package holds every other one the way the Hub's custom models do: a
config class and model classes that transformers loads from the folder's own Python files
(``trust_remote_code=True``). Those files are this package's modules and the library modules they run,
copied into the folder at export time (vendor.py), so the folder loads with torch and transformers
alone and every encoding and layer schedule exports as it runs here.

- ``configuration.py``: ``ExtraposConfig``, the run's ModelConfig inside a ``PreTrainedConfig``
- ``cache.py``: ``ExtraposCache``, the library's KV cache as the ``Cache`` ``generate`` passes around
- ``modeling.py``: ``ExtraposModel`` (hidden states), ``ExtraposForCausalLM``, ``ExtraposForMaskedLM``
- ``files.py``: the Python files written into an exported folder, and their ``auto_map``
- ``vendor.py``: those files: the import closure of ``modeling.py`` copied flat, imports made relative
- ``copy_code.py``: in a folder, ``files.py``'s stand-in: ``save_pretrained`` copies the folder's files
- ``export.py``: ``export_remote_code(RUN, DIR)``
- ``registration.py``: the Auto classes learn ``model_type = "extrapos"``; ``extrapos/auto_registration.py``
  runs it once transformers loads them after ``import extrapos``, so the folder also loads without
  ``trust_remote_code``

Kept apart from ``integrations/hf/`` because ``registration.py`` imports ``configuration.py`` while
transformers is still importing itself: this package's ``__init__`` imports nothing.
"""
