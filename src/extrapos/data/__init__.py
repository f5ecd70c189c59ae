"""Corpora, tokenizers, token shards on disk and window samplers."""
