"""Every extension point of plugd: the whole plugin contract in one file.

Each hook takes no arguments and returns a list of descriptors (attrs classes
below). The daemon calls every hook once when it loads plugins and keeps what
they return; a hook that raises marks its plugin failed and contributes
nothing. Things that run inside the runner process (model code, cache
policies, grammar engines) are named by an import path, so the daemon never
imports MLX or torch: only the runner imports them.

A plugin module implements hooks with the `hookimpl` marker:

    from plugd.hookspecs import hookimpl, Renderer

    @hookimpl
    def plugd_renderers():
        return [Renderer(name="mine", render=render)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

import pluggy
from attrs import define, field

from plugd.types import Media, Message, Prompt, Think, Tool, ToolCall

PROJECT = "plugd"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

PLUGIN_API_VERSION = "1.2"
# Where the config an architecture's `media_tokens` and `ModelArgs.from_dict` receive holds the checkpoint's image
# processor settings (plugd.image_processor): preprocessor_config.json, or processor_config.json's entry of that name.
IMAGE_PROCESSOR = "image_processor"
"""The plugin API this plugd implements, "MAJOR.MINOR".

MINOR grows when hooks or descriptor fields are added, MAJOR when any is
removed or changes meaning. A plugin states the version it was built for as a
module-level `PLUGD_API = "1.0"`; it loads when its MAJOR equals the core's
and its MINOR is at most the core's.
"""


@define(frozen=True)
class ModelFiles:
    """What a renderer or parser may look at to recognise a model: parsed config and chat template."""

    config: Mapping[str, Any]
    chat_template: str | None = None
    tokenizer_config: Mapping[str, Any] = field(factory=dict)


@define(frozen=True)
class LayerCache:
    """What one layer of a model caches for one sequence, in elements: the daemon's memory estimate multiplies it
    out (positions, the runner's compute dtype, the cache policy's snapshots of what cannot trim back)."""

    per_position: int = 0  # keys and values for each position, at the compute dtype
    window: int | None = None  # the most positions a sliding-window layer keeps; None: every position
    state: int = 0  # a fixed part at the compute dtype (a recurrent layer's convolution window)
    state_float32: int = 0  # a fixed part in float32 (a recurrent state)


def attention_cache(config: Mapping[str, Any], window: int | None = None) -> LayerCache:
    """One attention layer's cache, from transformers' config fields: keys and values of `num_key_value_heads`
    heads of `head_dim` for each position (of the last `window` ones, for a sliding-window layer)."""
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
    return LayerCache(2 * (config.get("num_key_value_heads") or heads) * head_dim, window)


def attention_layers(config: Mapping[str, Any]) -> list[LayerCache]:
    """The caches of a decoder whose every layer is attention: `num_hidden_layers` of them, or those that
    `layer_types` names, the "sliding_attention" ones keeping `sliding_window` positions. Any other layer type
    counts as full attention, never an underestimate."""
    kinds = config.get("layer_types") or ["full_attention"] * config.get("num_hidden_layers", 0)
    window = config.get("sliding_window")
    return [attention_cache(config, window if kind == "sliding_attention" and window else None) for kind in kinds]


@define(frozen=True)
class MediaTokens:
    """How a vision model's prompt holds an image: the text its renderer writes for one (`placeholder`), the text
    that replaces each placeholder before tokenization (`expansion`), and the token of one image position
    (`token_id`), of which the expansion holds exactly one run (its other tokens are text).

    An architecture whose images take as many positions as their size asks
    gives `expansion` as a function of the image's (width, height) in pixels,
    as the checkpoint's processor resizes it; the daemon calls it, so it must
    not need MLX."""

    placeholder: str
    expansion: str | Callable[[int, int], str]
    token_id: int

    def expand(self, width: int, height: int) -> str:
        """The text that stands for an image of `width` x `height` pixels."""
        return self.expansion if isinstance(self.expansion, str) else self.expansion(width, height)


@define(frozen=True)
class Architecture:
    """A model class for checkpoints whose config.json has this `model_type`.

    `module` is imported in the runner only. Like an mlx-lm model file it
    defines `ModelArgs.from_dict(config)` and `Model(args)`, whose
    `sanitize(weights)` returns the checkpoint's tensors renamed and folded
    (lazily) into the model's own parameters, `make_cache()` returns one cache
    per layer, and `__call__(tokens, cache)` returns logits.

    `media_types` are the MIME types the architecture's image processor takes;
    empty means the architecture has no vision. A model of an architecture
    with media types is reported with the `vision` capability; its
    `media_tokens(config)` (MLX-free: the daemon tokenizes prompts) says how a
    prompt holds an image, and its `Model` also gives `preprocess(image)`,
    `embed_media(pixels)` and takes `__call__(tokens, cache, media=[(start,
    embeddings)])` (see docs/plugins.md). Images in other formats are offered
    to the media transcoders first. Both `media_tokens` and `ModelArgs.from_dict`
    get config.json with the checkpoint's image processor settings under
    IMAGE_PROCESSOR. Where checkpoints of the model type may
    come without their tower (text-only conversions), `media_tensors` names
    the tower's tensor-name prefixes: only a checkpoint holding one takes images.
    Towers the architecture does not run (Gemma 4's audio) are named in
    `unsupported_towers`, input kind -> tensor-name prefixes, so that a model
    whose checkpoint carries one is reported as not supporting that input.
    `drafter_tensors` names the prefixes of a multi-token-prediction head's
    tensors (plugd.nn.mtp), which a runner group, decoding without drafting,
    leaves unread.

    `cache_layers(config)` (MLX-free: the daemon calls it) says what each
    layer caches for the model's text config; the default, `attention_layers`,
    suits a decoder of attention layers alone. (Which tensors quantizing
    treats apart, such as MoE routers, the `Model` says as mlx-lm's do: a
    `quant_predicate`.)
    """

    model_type: str
    module: str
    media_types: frozenset[str] = frozenset()
    cache_layers: Callable[[Mapping[str, Any]], list[LayerCache]] = attention_layers
    media_tokens: Callable[[Mapping[str, Any]], MediaTokens] | None = None
    media_tensors: tuple[str, ...] = ()
    unsupported_towers: Mapping[str, tuple[str, ...]] = field(factory=dict, hash=False)
    drafter_tensors: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.media_types and self.media_tokens is None:
            raise ValueError(f"architecture {self.model_type!r} takes images but says no media_tokens")

    def takes_images(self, tensor_names: Iterable[str]) -> bool:
        """Whether a checkpoint of this architecture holding `tensor_names` sees images."""
        if not self.media_types:
            return False
        return not self.media_tensors or any(name.startswith(self.media_tensors) for name in tensor_names)

    def unsupported_inputs(self, tensor_names: Iterable[str]) -> list[str]:
        """The kinds of input a checkpoint holding `tensor_names` has a tower for that this architecture does not
        run."""
        names = list(tensor_names)
        return [kind for kind, prefixes in self.unsupported_towers.items()
                if any(name.startswith(prefixes) for name in names)]


@define(frozen=True)
class RenderRequest:
    """A conversation to turn into a prompt for one model."""

    model: ModelFiles
    messages: Sequence[Message]
    tools: Sequence[Tool] = ()
    think: Think = None


@define(frozen=True)
class Renderer:
    """Turns a conversation into a Prompt.

    `detect`, when given, says whether this renderer is the natural one for a
    model; `plugd create` uses it to pick the model's default renderer.
    `aliases` are other names a model may give for it (Ollama's, in a model
    pulled from Ollama's library).
    """

    name: str
    render: Callable[[RenderRequest], Prompt]
    detect: Callable[[ModelFiles], bool] | None = None
    aliases: tuple[str, ...] = ()


@define(frozen=True)
class ParsedPiece:
    """One piece of parsed model output: thinking text, answer text, or a complete tool call."""

    kind: Literal["thinking", "content", "tool_call"]
    text: str = ""
    tool_call: ToolCall | None = None


class StreamParser(Protocol):
    """Consumes decoded text as it streams and returns what can already be told apart.

    `feed` holds back any suffix that may still turn out to be part of a tag;
    `finish` flushes it at the end of generation and raises ValueError when
    the output cannot be parsed.
    """

    def feed(self, text: str) -> list[ParsedPiece]: ...

    def finish(self) -> list[ParsedPiece]: ...


@define(frozen=True)
class ForcedCall:
    """How to make a model of this family call a tool, for tool_choice "required" or a named tool.

    `prefix` is appended to the prompt (the family's opening of a call), the
    model's output is constrained to the JSON Schema `schema`, and `suffix`
    (the family's closing of a call) is fed to the parser after it.
    """

    prefix: str
    schema: Mapping[str, Any]
    suffix: str = ""


@define(frozen=True)
class Parser:
    """Makes a streaming parser for one response.

    `create(tools, prompt)` is given the tools offered and the rendered prompt
    text, so that a parser can tell whether the prompt already opened a
    thinking block and the output starts inside it.

    `answer_after(prompt)`, when given, returns the text that ends the
    model's thinking when the answer to this prompt comes after a thinking
    block (None when it starts at once): a structured answer is enforced
    from there on. `forced_call(tools)`, when given, says how a call to one
    of `tools` is forced in the family's format. `aliases` are other names a
    model may give for it, as a Renderer's.
    """

    name: str
    create: Callable[[Sequence[Tool], str], StreamParser]
    detect: Callable[[ModelFiles], bool] | None = None
    answer_after: Callable[[str], str | None] | None = None
    forced_call: Callable[[Sequence[Tool]], ForcedCall] | None = None
    aliases: tuple[str, ...] = ()


@define(frozen=True)
class ClientRequest:
    """What a client renderer may inspect to decide whether a request comes from its client."""

    dialect: Literal["ollama", "openai", "anthropic"]
    headers: Mapping[str, str]
    model: ModelFiles
    messages: Sequence[Message]


@define(frozen=True)
class ClientRenderer:
    """A renderer for one client's habits; used only when enabled by configuration and `claims` is true.

    `render(request, model_render)` is also given the model's own render
    function, so that it can adjust the conversation and let the model's
    family renderer do the rest.
    """

    name: str
    claims: Callable[[ClientRequest], bool]
    render: Callable[[RenderRequest, Callable[[RenderRequest], Prompt]], Prompt]


@define(frozen=True)
class MediaTranscoder:
    """Converts a media item the model cannot take into one it can.

    `transcode(media, accepted_mime_types)` returns the converted item, or
    None when this transcoder has nothing to do with it.
    """

    name: str
    transcode: Callable[[Media, frozenset[str]], Media | None]


@define(frozen=True)
class CachePolicy:
    """Decides in the runner what is kept of the caches across requests.

    `factory` is an import path `module:callable` resolved in the runner and
    called with the loaded model; it returns an object with the model's caches
    (`layers`) and the tokens they hold (`tokens`), and these methods, called
    by the engine in this order per completion: `resume(prompt) -> int` (bring
    the caches to the longest prefix it can restore, short of the last prompt
    token, and return its length), `capture_points(start, end)` (positions
    where the prefill should pause for a restore point), `prefilled()` after
    every prefill chunk, `finished()` when the completion ends; plus `reserve`,
    `reset` and `stats() -> {"bytes", "nodes"}`. plugd.runner_api.LiveCache
    implements all but `resume` (the contract is in plugd.runner_api).
    PLUGD_CACHE_POLICY picks a policy by name; unset, the one of the highest
    `priority` runs (the built-in "single-slot" has 0).

    `budget`, for a policy that keeps more than the live caches, returns the
    most bytes it would keep per loaded model. The scheduler counts that in
    each load's memory estimate, lowered to what the memory fits leave once the
    model is loaded, and the factory is then called with `budget=` the bytes
    granted. It is called in the daemon, which must not import MLX.
    """

    name: str
    factory: str
    budget: Callable[[], int] | None = None
    priority: int = 0


@define(frozen=True)
class MemoryFit:
    """A bound on the bytes plugd's loaded models may use in all; the scheduler takes the tightest bound.

    `budget(held)` is given the bytes the loaded models' runners hold now
    (measured where the platform tells, estimated elsewhere) and returns the
    total the loaded models may come to hold, or None when it has no opinion
    (for example on a platform it does not know).
    """

    name: str
    budget: Callable[[int], int | None]


@define(frozen=True)
class GrammarEngine:
    """Compiles a `format` into per-step token masks in the runner; `factory` is an import path `module:callable`."""

    name: str
    factory: str
    formats: frozenset[str] = frozenset({"json", "json_schema"})


@hookspec
def plugd_architectures() -> list[Architecture]:
    """Model classes, one per config.json `model_type`."""


@hookspec
def plugd_renderers() -> list[Renderer]:
    """Renderers from conversations to prompts, by name."""


@hookspec
def plugd_parsers() -> list[Parser]:
    """Streaming output parsers (thinking, content, tool calls), by name."""


@hookspec
def plugd_client_renderers() -> list[ClientRenderer]:
    """Renderers for specific clients, enabled by configuration."""


@hookspec
def plugd_media_transcoders() -> list[MediaTranscoder]:
    """Converters for media formats a model cannot take."""


@hookspec
def plugd_cache_policies() -> list[CachePolicy]:
    """Runner cache policies, by name."""


@hookspec
def plugd_memory_fits() -> list[MemoryFit]:
    """Bounds on memory available for model loads."""


@hookspec
def plugd_grammar_engines() -> list[GrammarEngine]:
    """Engines that enforce structured output formats, by name."""


HOOKS: dict[str, type] = {
    "plugd_architectures": Architecture,
    "plugd_renderers": Renderer,
    "plugd_parsers": Parser,
    "plugd_client_renderers": ClientRenderer,
    "plugd_media_transcoders": MediaTranscoder,
    "plugd_cache_policies": CachePolicy,
    "plugd_memory_fits": MemoryFit,
    "plugd_grammar_engines": GrammarEngine,
}
"""Each hook and the descriptor class its results must be instances of."""

__all__ = [
    "Architecture",
    "CachePolicy",
    "ClientRenderer",
    "ClientRequest",
    "ForcedCall",
    "GrammarEngine",
    "HOOKS",
    "LayerCache",
    "Media",
    "MediaTokens",
    "MediaTranscoder",
    "MemoryFit",
    "Message",
    "ModelFiles",
    "PLUGIN_API_VERSION",
    "ParsedPiece",
    "Parser",
    "Prompt",
    "RenderRequest",
    "Renderer",
    "StreamParser",
    "Tool",
    "ToolCall",
    "attention_cache",
    "attention_layers",
    "hookimpl",
    "hookspec",
]
