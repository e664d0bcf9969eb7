from plugd.testing.plugins import assert_plugin_loads


def test_discovered_through_its_entry_point():
    info = assert_plugin_loads("render-qwen")
    assert info.provides == {
        "renderers": ["qwen3", "qwen3-instruct", "qwen3-coder", "qwen3.5", "qwen3.5-nothink", "qwen3.6"],
        "parsers": ["qwen3", "qwen3-coder", "qwen3.5"],
    }
