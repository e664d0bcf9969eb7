"""WebP media transcoder for plugd."""

PLUGD_API = "1.0"
