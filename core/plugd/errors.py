"""The base of plugd's own failures: each says the HTTP status it is answered with (in the error shape of the
dialect that was asked) and its `kind`, so that no table elsewhere has to know them."""

from __future__ import annotations

import re


class PlugdError(Exception):
    """A failure answered with `status`: a 4xx says the request was at fault, a 5xx plugd or what it relies on.

    `kind` names the failure for programs (an OpenAI error's `code`): the class's name in snake case unless the
    class says otherwise (ModelNotFound: "model_not_found").
    """

    status = 500
    kind = "plugd_error"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            cls.kind = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", cls.__name__).lower()
