"""Any extrapos run as a Hugging Face model folder that ``transformers`` loads with its Auto classes
(``extrapos export RUN --format remote-code``; docs/huggingface.md).

A native architecture (GPT-2, GPT-NeoX, Llama, Qwen2, Bloom; ``integrations/hf/``) holds only the
encodings Hugging Face has. This package holds every other one the way the Hub's custom models do: a
config class and model classes that transformers loads from the folder's own Python files
(``trust_remote_code=True``), which here are a few lines importing the installed extrapos, so the model
is built by the library itself and every encoding and layer schedule exports.

- ``configuration.py``: ``ExtraposConfig``, the run's ModelConfig inside a ``PreTrainedConfig``
- ``cache.py``: ``ExtraposCache``, the library's KV cache as the ``Cache`` ``generate`` passes around
- ``modeling.py``: ``ExtraposModel`` (hidden states), ``ExtraposForCausalLM``, ``ExtraposForMaskedLM``
- ``files.py``: the Python files written into an exported folder, and their ``auto_map``
- ``export.py``: ``export_remote_code(RUN, DIR)``
- ``registration.py``: the Auto classes learn ``model_type = "extrapos"``; ``extrapos/auto_registration.py``
  runs it once transformers loads them after ``import extrapos``, so the folder also loads without
  ``trust_remote_code``

Kept apart from ``integrations/hf/`` because ``registration.py`` imports ``configuration.py`` while
transformers is still importing itself: this package's ``__init__`` imports nothing.
"""
