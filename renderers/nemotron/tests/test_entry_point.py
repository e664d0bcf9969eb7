from plugd import plugins
from plugd.testing.plugins import assert_plugin_loads


def test_discovered_through_its_entry_point():
    assert_plugin_loads("render-nemotron")


def test_provides_both_families_renderers_and_parsers():
    registry = plugins.load()
    families = {"nemotron-nano-v2", "nemotron-3-nano"}
    assert families <= set(registry.renderers()) and families <= set(registry.parsers())
    assert all(registry.renderers()[name].detect and registry.parsers()[name].detect for name in families)
