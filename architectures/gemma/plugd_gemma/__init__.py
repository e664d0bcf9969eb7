"""Gemma architectures for plugd."""
