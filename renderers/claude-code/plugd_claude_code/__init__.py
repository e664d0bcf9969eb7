"""A plugd renderer for Claude Code's request habits."""
