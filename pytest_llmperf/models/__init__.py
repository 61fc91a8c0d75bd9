"""The embedded synthetic model and facts read from GGUF files."""
