"""Which cache policy the runners use.

PLUGD_CACHE_POLICY picks a policy by name; unset, the installed policy of the highest priority (the built-in
"single-slot" has the lowest, 0). The daemon makes the same choice as the runners, to count the policy's budget
in each load's memory estimate; this module imports no MLX, so the daemon can.
"""

from __future__ import annotations

from plugd.hookspecs import CachePolicy


def chosen_policy(policies: dict[str, CachePolicy], wanted: str | None = None) -> CachePolicy:
    """The policy named `wanted` (PLUGD_CACHE_POLICY), else the one of the highest priority (of equals, the
    first)."""
    if wanted:
        if wanted not in policies:
            raise ValueError(f"unknown cache policy {wanted!r}; available: {', '.join(sorted(policies))}")
        return policies[wanted]
    return max(policies.values(), key=lambda policy: policy.priority)

