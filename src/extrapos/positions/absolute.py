"""placeholder: filled in by the encodings work."""
