"""WebP media transcoder for plugd."""
