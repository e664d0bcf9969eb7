"""WebP media transcoder for plugd: WebP images become lossless PNG for models that do not take WebP."""

from plugd.hookspecs import MediaTranscoder, hookimpl
from plugd_webp.transcode import transcode

PLUGD_API = "1.0"


@hookimpl
def plugd_media_transcoders() -> list[MediaTranscoder]:
    return [MediaTranscoder(name="webp", transcode=transcode)]
