"""The Kubernetes client with its network replaced: the real client builds the requests and parses the
responses; a FakeTransport stands in for urllib3's pool manager (shared by test_kube and test_metrics)."""

from __future__ import annotations

import http.client
import io
import json
from typing import Any

import urllib3
from kubernetes import client

from cpullm.io.kube import BoundedApiClient, Kube

RESET = urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))


class FakeTransport:
    """Records each request and answers with a canned status and body (a Status naming the code when none is
    given), or the next of `pages` (a paged listing), echoes the request body (as the API server answers a
    create), or raises the connection error; `cut` ends the body's stream mid-answer, as an API server that
    stops does."""

    def __init__(
        self,
        status: int = 200,
        body: Any = None,
        error: Exception | None = None,
        echo: bool = False,
        pages: list[Any] | None = None,
        cut: bool = False,
    ) -> None:
        self.status, self.body, self.error, self.echo, self.cut = status, body, error, echo, cut
        self.pages = list(pages or [])
        self.requests: list[dict[str, Any]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        self.requests.append({"method": method, "url": url, **kwargs})
        if self.error is not None:
            raise self.error
        body = self.body if self.body is not None else {"kind": "Status", "message": f"said {self.status}"}
        if self.pages:
            body = self.pages.pop(0)
        if self.echo:
            body = json.loads(kwargs["body"])
        data = json.dumps(body).encode()
        return urllib3.HTTPResponse(
            body=_CutStream(data) if self.cut else io.BytesIO(data),
            status=self.status,
            reason="Fake",
            headers={"Content-Type": "application/json"},
            preload_content=False,
        )


class _CutStream(io.BytesIO):
    """A body whose connection closes after its first half, as http.client reports it."""

    def read(self, size: int | None = -1) -> bytes:
        raise http.client.IncompleteRead(self.getvalue()[: len(self.getvalue()) // 2], len(self.getvalue()))


def kube(transport: FakeTransport) -> Kube:
    api_client = BoundedApiClient(client.Configuration(host="http://api.invalid"))
    api_client.rest_client.pool_manager = transport
    return Kube(api_client)
