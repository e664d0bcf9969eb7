"""Nemotron-H architecture for plugd."""
