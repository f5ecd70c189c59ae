"""Using a trained run (the commands layer): ``generate`` (`extrapos generate`: sampling with a KV
cache) and ``embeddings`` (sentence embeddings from an encoder run). They import the run layer, and
the memory checks of ``tasks.common``; the package re-exports nothing, so an import names its module
(``from extrapos.inference.generate import generate_text``).
"""
