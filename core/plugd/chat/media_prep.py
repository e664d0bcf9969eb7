"""A prompt's images made fit for its model: formats the architecture does not take go through the media transcoders."""

from __future__ import annotations

from plugd.chat.request import InvalidRequest
from plugd.hookspecs import Architecture, MediaTranscoder
from plugd.media import checked_format
from plugd.plugins import Registry
from plugd.types import Media


class MediaPreparer:
    """Converts the images of one model's prompts, remembering each conversion (a request renders several times
    while it is fitted to num_ctx)."""

    def __init__(self, registry: Registry, model_name: object, architecture: Architecture | None):
        self._transcoders: list[MediaTranscoder] = list(registry.items.get("plugd_media_transcoders", []))
        self._model_name = model_name
        self._accepted = architecture.media_types if architecture is not None else frozenset()
        self._done: dict[str, Media] = {}

    def prepare(self, media: list[Media]) -> list[Media]:
        """`media` in formats the model takes; InvalidRequest naming the problem when an item cannot be."""
        if media and not self._accepted:
            raise InvalidRequest(f"model '{self._model_name}' does not support images")
        return [self._prepared(item) for item in media]

    def _prepared(self, item: Media) -> Media:
        if (done := self._done.get(item.key)) is None:
            done = self._done[item.key] = self._converted(item)
        return done

    def _converted(self, item: Media) -> Media:
        if item.mime_type in self._accepted:
            return item
        for transcoder in self._transcoders:
            try:
                converted = transcoder.transcode(item, self._accepted)
            except ValueError as exc:
                raise InvalidRequest(f"invalid image: {exc}") from None
            if converted is not None:
                if converted.mime_type not in self._accepted:
                    raise InvalidRequest(f"media transcoder {transcoder.name!r} converted a {item.mime_type} image to "
                                         f"{converted.mime_type}, which model '{self._model_name}' does not take")
                try:
                    checked_format(converted.data)
                except ValueError as exc:
                    raise InvalidRequest(f"media transcoder {transcoder.name!r} produced a bad image: {exc}") from None
                return converted
        hint = "; install plugd-webp to convert WebP images" if item.mime_type == "image/webp" else ""
        raise InvalidRequest(f"model '{self._model_name}' takes images as {', '.join(sorted(self._accepted))}, "
                             f"not {item.mime_type}, and no installed media transcoder converts it{hint}")

