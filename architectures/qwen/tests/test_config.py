"""Reading both config.json vintages: older hub configs and those written by transformers 5."""

from __future__ import annotations

import pytest

from plugd.nn.rope import rope_base
from plugd.testing.checkpoints import BASE_CONFIGS
from plugd_qwen import qwen3_moe


def test_rope_base_reads_both_vintages():
    assert rope_base({"rope_theta": 5e5, "rope_scaling": None}) == 5e5
    assert rope_base({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}) == 5e5


@pytest.mark.parametrize(
    "config",
    [
        {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4.0}},
        {"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}},
    ],
)
def test_scaled_rope_is_refused_rather_than_run_unscaled(config):
    with pytest.raises(ValueError, match="yarn"):
        rope_base(config)


def test_rope_without_a_base_is_refused():
    with pytest.raises(ValueError, match="rope_theta"):
        rope_base({"rope_parameters": {"rope_type": "default"}})


def test_moe_args_read_num_local_experts():
    older = {**BASE_CONFIGS["qwen3_moe"], "vocab_size": 512}
    newer = {key: value for key, value in older.items() if key not in ("num_experts", "rope_theta")}
    newer |= {"num_local_experts": older["num_experts"], "rope_parameters": {"rope_theta": older["rope_theta"]}}
    assert qwen3_moe.ModelArgs.from_dict(newer) == qwen3_moe.ModelArgs.from_dict(older)
    assert qwen3_moe.ModelArgs.from_dict(older).num_experts == 4
