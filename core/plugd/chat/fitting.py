"""Fitting a conversation into num_ctx as Ollama does: its oldest turns dropped (never system ones, never the
last), an assistant turn together with the tool results that answer it, as few as will do.

The search starts from a guess and checks candidates exactly (rendered with the model's template, counted with
its tokenizer). For a conversation far longer than the context the guess comes from the newest turns' texts,
counted apart until they fill the context, so the work follows the context's size, not the conversation's: a
1,000-turn history fitted into 1,024 tokens encodes a few dozen messages and renders a few short candidates.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import anyio
from attrs import define

from plugd.chat.tokens import EncodedPrompt
from plugd.tokenizer import Tokenizer
from plugd.types import Message, Prompt

# Tokens a tokenizer may add that cover no byte of the text: a BOS, an EOS, a dummy-prefix space.
ADDED_TOKENS_BOUND = 8
# A conversation of more bytes than this per context token is taken not to fit, and the search starts from the
# newest turns' guess instead of encoding it whole (text averages about 4 bytes a token; the checks are exact).
LIKELY_BYTES_PER_TOKEN = 8


@define
class Fitted:
    prompt: Prompt
    encoded: EncodedPrompt | None = None  # where it was counted
    fits: bool = True


def droppable_turns(messages: list[Message]) -> list[range]:
    """The turns truncation may drop, oldest first: each message but system ones and the last, an assistant turn
    together with the tool results that answer it."""
    turns, index, last = [], 0, len(messages) - 1
    while index < last:
        if messages[index].role in ("system", "developer", "tool"):
            index += 1
            continue
        end = index + 1
        while end < last and messages[end].role == "tool":
            end += 1
        turns.append(range(index, end))
        index = end
    return turns


async def fitted(messages: list[Message], num_ctx: int, render: Callable[[list[Message]], Awaitable[Prompt]],
                 encode: Callable[[Prompt], Awaitable[EncodedPrompt]], tokenizer: Tokenizer) -> Fitted:
    """The conversation rendered with as few of its oldest turns dropped as make it fit `num_ctx`; when even
    dropping them all does not, the shortest (the runner truncates it). `encode` encodes a candidate prompt (its
    images expanded), `tokenizer` the guess's texts."""
    turns = droppable_turns(messages)

    async def candidate(dropped_turns: int) -> Fitted:
        dropped = {index for turn in turns[:dropped_turns] for index in turn}
        prompt = await render([m for i, m in enumerate(messages) if i not in dropped])
        if not prompt.media and len(prompt.text.encode()) + ADDED_TOKENS_BOUND <= num_ctx:
            return Fitted(prompt)  # every other token covers at least a byte: no need to count
        encoded = await encode(prompt)
        return Fitted(prompt, encoded, len(encoded.tokens) <= num_ctx)

    if not turns:
        return await candidate(0)
    size = sum(len(_text(m).encode()) for m in messages)
    start = 0
    if size > LIKELY_BYTES_PER_TOKEN * num_ctx:
        start = await anyio.to_thread.run_sync(_guess, tokenizer, messages, turns, num_ctx)
    return await _fewest(candidate, start, len(turns))


def _text(message: Message) -> str:
    calls = "".join(call.name + json.dumps(call.arguments) for call in message.tool_calls)
    return message.content + (message.thinking or "") + calls


def _guess(tokenizer: Tokenizer, messages: list[Message], turns: list[range], num_ctx: int) -> int:
    """Turns to drop so that the rest's texts, counted apart (without the template's markup), fit num_ctx beside
    the messages that always stay: counted from the newest turn back, until the context is full."""
    def tokens(indices) -> int:
        return sum(len(tokenizer.encode(_text(messages[i]))) for i in indices)

    droppable = {index for turn in turns for index in turn}
    room = num_ctx - tokens(i for i in range(len(messages)) if i not in droppable)
    for index in reversed(range(len(turns))):
        room -= tokens(turns[index])
        if room < 0:
            return index + 1
    return 0


async def _fewest(candidate: Callable[[int], Awaitable[Fitted]], start: int, most: int) -> Fitted:
    """The candidate dropping the fewest turns that fits (dropping more never lengthens a prompt): from `start`,
    galloping until a bracket is found, then bisecting it; the one dropping `most` when none fits."""
    seen: dict[int, Fitted] = {}

    async def fits(dropped: int) -> bool:
        if dropped not in seen:
            seen[dropped] = await candidate(dropped)
        return seen[dropped].fits

    low, high = -1, most + 1  # dropping `low` does not fit (-1: nothing known), dropping `high` does (most + 1: idem)
    step, probe = 1, min(start, most)
    if await fits(probe):
        high = probe
        while high > 0:
            probe = max(high - step, 0)
            if not await fits(probe):
                low = probe
                break
            high, step = probe, step * 2
    else:
        low = probe
        while low < most:
            probe = min(low + step, most)
            if await fits(probe):
                high = probe
                break
            low, step = probe, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if await fits(middle):
            high = middle
        else:
            low = middle
    return seen[high] if high <= most else seen[most]
