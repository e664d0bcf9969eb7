"""Structured output for plugd through xgrammar."""
