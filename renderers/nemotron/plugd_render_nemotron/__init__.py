"""Nemotron chat renderers and output parsers for plugd."""
