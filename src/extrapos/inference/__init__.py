"""Using a trained run (the commands layer): ``generate`` (`extrapos generate`: sampling with a KV
cache) and ``embeddings`` (sentence embeddings from an encoder run). They import the run layer (its
memory estimates, ``run.memory``, among them) and no other command; the package re-exports nothing, so
an import names its module (``from extrapos.inference.generate import generate_text``).
"""
