"""Recognising a Qwen family's chat template by the instructions and markers only that family's template writes."""

from __future__ import annotations

from plugd.hookspecs import ModelFiles

_CHATML = "<|im_start|>"
_HERMES_FORMAT = "<args-json-object>"
_QWEN25_DEFAULT_SYSTEM = "created by Alibaba Cloud"  # Qwen2.5 writes a default system turn; Qwen3 does not
_XML_FORMAT = "<function=example_function_name>"
_VISION = "<|vision_start|><|image_pad|><|vision_end|>"
_THINK = "<think>"
_THINKING_OPT_IN = "enable_thinking is true"
_PRESERVE_THINKING = "preserve_thinking"


def _template(model: ModelFiles) -> str:
    return model.chat_template or ""


def _is_hermes(template: str) -> bool:
    return _CHATML in template and _HERMES_FORMAT in template and _QWEN25_DEFAULT_SYSTEM not in template


def is_qwen3(model: ModelFiles) -> bool:
    """Qwen3 (hybrid thinking) with Hermes JSON tool calls."""
    template = _template(model)
    return _is_hermes(template) and _THINK in template


def is_qwen3_instruct(model: ModelFiles) -> bool:
    """Qwen3 Instruct-2507: the Qwen3 template with every trace of thinking taken out."""
    template = _template(model)
    return _is_hermes(template) and _THINK not in template


def is_qwen3_family(model: ModelFiles) -> bool:
    return _is_hermes(_template(model))


def is_qwen3_coder(model: ModelFiles) -> bool:
    template = _template(model)
    return _CHATML in template and _XML_FORMAT in template and _VISION not in template and _THINK not in template


def is_qwen35_family(model: ModelFiles) -> bool:
    template = _template(model)
    return _CHATML in template and _XML_FORMAT in template and _VISION in template and _THINK in template


def qwen35_variant(model: ModelFiles) -> str | None:
    """Which Qwen3.5-family template this is: "qwen3.5", "qwen3.5-nothink" (thinking off unless asked) or "qwen3.6"."""
    if not is_qwen35_family(model):
        return None
    template = _template(model)
    thinks_by_default = _THINKING_OPT_IN not in template
    preserves = _PRESERVE_THINKING in template
    if preserves:
        return "qwen3.6" if thinks_by_default else None
    return "qwen3.5" if thinks_by_default else "qwen3.5-nothink"
