"""Built-in cache policy: the runner keeps the last completion's caches and reuses their longest common prefix."""

from plugd.hookspecs import CachePolicy, hookimpl


@hookimpl
def plugd_cache_policies():
    return [CachePolicy(name="single-slot", factory="plugd.runner.cache_policy:single_slot")]
