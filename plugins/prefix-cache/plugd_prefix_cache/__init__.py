"""Token-trie prefix cache policy for plugd."""
