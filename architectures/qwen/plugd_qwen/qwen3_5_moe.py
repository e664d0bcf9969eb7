"""Qwen3.5-MoE, config.json model_type "qwen3_5_moe": Qwen3.5 (plugd_qwen.qwen3_5) whose every feed-forward
is routed experts plus a gated shared expert. Hub checkpoints hold the experts fused
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); `sanitize` splits and stacks them.
"""

from plugd_qwen.qwen3_5 import Model, ModelArgs

__all__ = ["Model", "ModelArgs"]
