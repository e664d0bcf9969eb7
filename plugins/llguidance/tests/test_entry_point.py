from plugd.testing.plugins import assert_plugin_loads


def test_discovered_through_its_entry_point():
    assert_plugin_loads("llguidance")
