"""Nemotron chat renderers and output parsers for plugd: Nemotron Nano v2 and Nemotron 3 Nano."""

from plugd.hookspecs import Parser, Renderer, hookimpl

from . import nano3, nano_v2
from .parsers import nano3_parser, nano_v2_parser

PLUGD_API = "1.2"  # the plugd plugin API this plugin is built for


@hookimpl
def plugd_renderers():
    return [
        Renderer(name=nano_v2.NAME, render=nano_v2.render, detect=nano_v2.detect),
        Renderer(name=nano3.NAME, render=nano3.render, detect=nano3.detect),
    ]


@hookimpl
def plugd_parsers():
    return [
        Parser(name=nano_v2.NAME, create=nano_v2_parser, detect=nano_v2.detect),
        Parser(name=nano3.NAME, create=nano3_parser, detect=nano3.detect, aliases=("nemotron-3.5-nano",)),
    ]
