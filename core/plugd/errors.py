"""The base of plugd's own failures: each says the HTTP status it is answered with (in the error shape of the
dialect that was asked), so that no table elsewhere has to know them."""


class PlugdError(Exception):
    """A failure answered with `status`: a 4xx says the request was at fault, a 5xx plugd or what it relies on."""

    status = 500
