import pytest

from plugd.store.names import InvalidName, ModelName


@pytest.mark.parametrize(
    "text, parts, display",
    [
        ("qwen3", ("registry.ollama.ai", "library", "qwen3", "latest"), "qwen3:latest"),
        ("qwen3:0.6b", ("registry.ollama.ai", "library", "qwen3", "0.6b"), "qwen3:0.6b"),
        ("me/tiny", ("registry.ollama.ai", "me", "tiny", "latest"), "me/tiny:latest"),
        ("example.com:5000/team/m:v1", ("example.com:5000", "team", "m", "v1"), "example.com:5000/team/m:v1"),
        ("Qwen3:Q4_K_M", ("registry.ollama.ai", "library", "qwen3", "q4_k_m"), "qwen3:q4_k_m"),
        ("_under.score-ok", ("registry.ollama.ai", "library", "_under.score-ok", "latest"), "_under.score-ok:latest"),
    ],
)
def test_valid_names(text, parts, display):
    name = ModelName.parse(text)
    assert name.parts == parts
    assert name.display() == display


@pytest.mark.parametrize(
    "text",
    [
        "", "../etc", "a/../../b", "..", "./x", "a/b/c/d", "x:", ":tag", "/abs", "a//b", "sp ace", "tab\tx",
        "x:../y", "ns.dots/m", "-leading", "m:-tag", "a" * 81, "m:" + "t" * 81, "h" * 351 + "/n/m", "nul\x00",
        "back\\slash",
    ],
)
def test_malformed_names_are_refused(text):
    with pytest.raises(InvalidName):
        ModelName.parse(text)


def test_length_limits_are_inclusive():
    assert ModelName.parse("a" * 80).model == "a" * 80
    assert ModelName.parse("m:" + "t" * 80).tag == "t" * 80
    assert ModelName.parse("h" * 350 + "/n/m").host == "h" * 350


def test_a_bad_bare_name_is_said_once_with_the_rule():
    with pytest.raises(InvalidName) as bare:
        ModelName.parse("x!")
    assert str(bare.value) == (
        "invalid model name 'x!': it must begin with a letter, digit or '_', then hold only those or '-', '.'; "
        "80 characters at most")
    with pytest.raises(InvalidName) as part:
        ModelName.parse("team!/x")
    assert str(part.value).startswith("invalid model name 'team!/x': its namespace 'team!' must begin with")
