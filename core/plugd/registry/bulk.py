"""An httpx transport for blob downloads: the body goes from the socket straight into the caller's buffer
(`response.extensions[BODY].readinto`), one copy per byte and no Python work per chunk under the GIL.

httpx's own transport hands a body through h11 in 64 KiB pieces, copying each piece three times in Python;
at the rate a loopback or LAN registry serves a multi-GiB blob that costs more CPU than the download itself.
Connections come from the same guarded backend as every other request of the session, so each address is
checked the same way; each request has a connection of its own, closed with its response.
"""

from __future__ import annotations

import http.client
import ssl
from collections.abc import Iterator

import httpcore
import httpx

from plugd.registry.transport import GuardedBackend

READ_SIZE = 1 << 20
BODY = "plugd.bulk_body"  # the response extension holding the BulkBody (httpx wraps the stream itself)


class BulkBody(httpx.SyncByteStream):
    def __init__(self, response: http.client.HTTPResponse, stream: httpcore.NetworkStream):
        self.response = response
        self.stream = stream

    def readinto(self, buffer: memoryview) -> int:
        """Read up to len(buffer) bytes of the body into `buffer`; 0 at its end (or when the server hung up early)."""
        try:
            return self.response.readinto(buffer)
        except (OSError, http.client.HTTPException) as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    def __iter__(self) -> Iterator[bytes]:
        buffer = memoryview(bytearray(READ_SIZE))
        while count := self.readinto(buffer):
            yield bytes(buffer[:count])

    def close(self) -> None:
        self.response.close()
        self.stream.close()


class BulkTransport(httpx.BaseTransport):
    def __init__(self, backend: GuardedBackend, ssl_context: ssl.SSLContext):
        self.backend = backend
        self.ssl_context = ssl_context

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            stream = self.backend.connect_tcp(url.host, port, timeouts.get("connect"))
            if url.scheme == "https":
                stream = stream.start_tls(self.ssl_context, url.host, timeouts.get("connect"))
        except httpcore.ConnectTimeout as exc:
            raise httpx.ConnectTimeout(str(exc), request=request) from exc
        except httpcore.ConnectError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        try:
            socket = stream.get_extra_info("socket")
            socket.settimeout(timeouts.get("read"))
            connection = http.client.HTTPConnection(url.host, port)  # frames the request, parses the answer
            connection.sock = socket
            connection.putrequest(request.method, url.raw_path.decode("ascii"), skip_host=True,
                                  skip_accept_encoding=True)
            for key, value in request.headers.multi_items():
                if key.lower() != "connection":
                    connection.putheader(key, value)
            connection.putheader("Connection", "close")
            connection.endheaders(request.read() or None)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            stream.close()
            raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
        body = BulkBody(response, stream)
        return httpx.Response(response.status, headers=response.getheaders(), stream=body, request=request,
                              extensions={BODY: body})
