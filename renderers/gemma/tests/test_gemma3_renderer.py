"""Gemma 3 renderer: byte parity with the upstream template, and the documented forms where upstream raises."""

from __future__ import annotations

import pytest

from plugd.hookspecs import ModelFiles, RenderRequest
from plugd.types import Media, Message, Tool, ToolCall
from plugd_render_gemma import gemma3

CAT, DOG = Media(b"cat-bytes", "image/png"), Media(b"dog-bytes", "image/jpeg")

PARITY = {
    "user only": [Message("user", "Hello!")],
    "system and user": [Message("system", "  Be terse.\n"), Message("user", "  Hi there  ")],
    "empty system": [Message("system", ""), Message("user", "Hi")],
    "multi-turn": [
        Message("system", "You are a poet."),
        Message("user", "Write a haiku."),
        Message("assistant", "  Autumn moonlight—\na worm digs silently\ninto the chestnut.  ", thinking="dropped"),
        Message("user", "Another, about code."),
    ],
    "ends with assistant": [Message("user", "Hi"), Message("assistant", "Hello")],
    "images": [Message("user", "What is in these pictures?", images=[CAT, DOG])],
    "system and images": [Message("system", "Describe."), Message("user", " What? ", images=[CAT])],
    "images in later turns": [
        Message("user", "One", images=[CAT]),
        Message("assistant", "A cat."),
        Message("user", "Two", images=[DOG]),
    ],
}


def _render(messages, tools=(), think=None, files=None):
    return gemma3.render(RenderRequest(files("gemma3"), messages, tools, think))


@pytest.mark.parametrize("think", [None, False, True])
@pytest.mark.parametrize("name", list(PARITY))
def test_matches_the_upstream_template(name, think, upstream, files):
    messages = PARITY[name]
    prompt = _render(messages, think=think, files=files)
    assert prompt.text == upstream("gemma3", messages, think=think)
    assert prompt.media == [image for m in messages for image in m.images]


def test_bos_token_may_be_an_added_token_dict(files):
    model = ModelFiles(config={}, chat_template=files("gemma3").chat_template,
                       tokenizer_config={"bos_token": {"content": "<bos>", "special": True}})
    assert gemma3.render(RenderRequest(model, [Message("user", "Hi")])).text.startswith("<bos><start_of_turn>user\n")


def test_system_after_user_joins_the_user_turn(files):
    messages = [Message("user", "Fix the bug."), Message("system", " Reminder: tests must pass. "),
                Message("assistant", "Done."), Message("system", "Be brief."), Message("user", "Thanks", images=[CAT])]
    prompt = _render(messages, files=files)
    assert prompt.text == (
        "<bos><start_of_turn>user\nFix the bug.\n\nReminder: tests must pass.<end_of_turn>\n"
        "<start_of_turn>model\nDone.<end_of_turn>\n"
        "<start_of_turn>user\nBe brief.\n\n<start_of_image>Thanks<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert prompt.media == [CAT]


def test_developer_is_system(upstream, files):
    developer = [Message("developer", "Use tabs."), Message("user", "Hi"), Message("developer", "Answer in French.")]
    system = [Message("system", "Use tabs."), Message("user", "Hi")]
    assert _render(developer, files=files).text == (
        upstream("gemma3", system)[: -len("<end_of_turn>\n<start_of_turn>model\n")]
        + "\n\nAnswer in French.<end_of_turn>\n<start_of_turn>model\n"
    )


def test_consecutive_messages_of_one_side_share_a_turn(files):
    messages = [Message("assistant", "Welcome!"), Message("user", "Hi"), Message("user", "Anyone?"),
                Message("assistant", "Yes."), Message("assistant", "I am here.")]
    assert _render(messages, files=files).text == (
        "<bos><start_of_turn>model\nWelcome!<end_of_turn>\n"
        "<start_of_turn>user\nHi\n\nAnyone?<end_of_turn>\n"
        "<start_of_turn>model\nYes.\n\nI am here.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_a_lone_system_message_is_a_user_turn(files):
    assert _render([Message("system", "Say hi.")], files=files).text == (
        "<bos><start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n"
    )


@pytest.mark.parametrize(
    "messages, tools, complaint",
    [
        ([Message("user", "Hi")], [Tool("ping")], "tool"),
        ([Message("user", "Hi"), Message("assistant", "", tool_calls=[ToolCall("ping")])], [], "tool"),
        ([Message("user", "Hi"), Message("tool", "pong", tool_name="ping")], [], "tool"),
        ([Message("robot", "beep")], [], "'robot'"),
        ([Message("system", "Look", images=[CAT]), Message("user", "Hi")], [], "images"),
    ],
)
def test_refuses_what_it_cannot_render(messages, tools, complaint, files):
    with pytest.raises(ValueError, match=complaint):
        _render(messages, tools, files=files)
