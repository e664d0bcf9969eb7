"""Qwen chat renderers and output parsers for plugd."""
