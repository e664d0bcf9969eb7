"""Token-trie prefix cache policy for plugd: restore points across conversations, LRU under a byte budget.

Only the descriptor lives here: the daemon imports this module and must not import MLX; the runner imports
the policy through its factory path.
"""

from plugd.hookspecs import CachePolicy, hookimpl
from plugd_prefix_cache.budget import default_budget

PLUGD_API = "1.2"


@hookimpl
def plugd_cache_policies():
    return [CachePolicy(name="prefix-cache", factory="plugd_prefix_cache.policy:prefix_cache", budget=default_budget,
                        priority=10)]
