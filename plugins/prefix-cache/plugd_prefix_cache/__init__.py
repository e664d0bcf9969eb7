"""Token-trie prefix cache policy for plugd."""

PLUGD_API = "1.0"
