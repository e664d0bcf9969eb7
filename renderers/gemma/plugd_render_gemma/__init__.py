"""Gemma chat renderers and output parsers for plugd."""
