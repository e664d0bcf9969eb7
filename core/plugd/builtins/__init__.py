"""Core features written as plugins on the same manager as third-party ones."""

from plugd.builtins import jinja_renderer, single_slot, system_memory

BUILTIN_MODULES = (system_memory, jinja_renderer, single_slot)
