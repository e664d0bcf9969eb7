"""Figures the runner works with that the daemon must know too (its memory estimate, the embedding requests it
sends): both read them here (the daemon imports no MLX)."""

CACHE_STEP = 256  # KV buffers grow this many positions at a time
ROTATING_SLACK = 256  # a sliding-window buffer keeps this many positions past its window
# The positions a decoding batch's caches make room for past their longest row when a sequence joins (no more than
# the rows may reach), so that memory stays flat while they decode; beyond that they double.
DECODE_HEADROOM = 4096
PREFILL_CHUNK = 512  # the most prompt positions one prefill step evaluates
SNAPSHOT_LIMIT = 8  # the built-in cache policy's snapshots of the layers that cannot trim back
EMBED_BATCH_TOKENS = 1024  # padded positions one embedding batch holds (more ran slower on a CPU: 8,192, 0.6x)
DRAFT_TOKENS = 8  # the most tokens a speculative round drafts, unless a request's draft_tokens says otherwise
MAX_DRAFT_TOKENS = 16  # the most a request's draft_tokens may ask for
