"""Raw JSON calls to the API server with the test's (admin) credentials: server-side apply,
status patches, watches — what the chaos cases send, as plain dicts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

Obj = dict[str, Any]
APPLY = "application/apply-patch+yaml"  # JSON is YAML: server-side apply takes it as it is
MERGE = "application/merge-patch+json"


class Expired(Exception):
    """A watch's resourceVersion is gone (410): list again."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Obj

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


class Rest:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def _send(self, method: str, path: str, body: Any = None,
              query: list[tuple[str, str]] | None = None,
              content_type: str = "application/json",
              timeout: tuple[float, float] = (5, 30)) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.api.param_serialize(method, path, query_params=query or [],
                                           header_params=headers, body=body,
                                           auth_settings=["BearerToken"])
        return self.api.call_api(*request, _request_timeout=timeout)

    def request(self, method: str, path: str, body: Any = None,
                query: list[tuple[str, str]] | None = None,
                content_type: str = "application/json",
                timeout: tuple[float, float] = (5, 30)) -> Answer:
        """One call; the answer whatever its status (connection errors raise)."""
        response = self._send(method, path, body, query, content_type, timeout)
        response.read()
        try:
            found = json.loads(response.data) if response.data else {}
        except ValueError:
            found = {"message": response.data.decode(errors="replace")}
        return Answer(response.status, found if isinstance(found, dict) else {})

    def call(self, method: str, path: str, body: Any = None,
             query: list[tuple[str, str]] | None = None,
             content_type: str = "application/json") -> Obj:
        """One call that must succeed."""
        answer = self.request(method, path, body, query, content_type)
        if not answer.ok:
            raise ApiException(status=answer.status, reason=answer.message)
        return answer.body

    def watch(self, path: str, version: str, server_timeout: int = 60,
              read_timeout: float = 90) -> Iterator[Obj]:
        """Watch events from `version` (bookmarks included) until the server ends the stream."""
        query = [("watch", "true"), ("resourceVersion", version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(server_timeout))]
        response = self._send("GET", path, query=query, timeout=(5, read_timeout))
        if not 200 <= response.status < 300:
            response.read()
            if response.status == 410:
                raise Expired(path)
            raise ApiException(status=response.status, reason=str(response.data[:300]))
        raw = response.response
        try:
            buffer = b""
            for chunk in raw.stream(64 * 1024, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event: Obj = json.loads(line)
                    if event.get("type") == "ERROR":
                        error = event.get("object") or {}
                        if error.get("code") == 410:
                            raise Expired(path)
                        raise ApiException(status=error.get("code"), reason=error.get("message"))
                    yield event
        finally:
            raw.release_conn()


def pods_path(namespace: str, name: str | None = None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def jobs_path(namespace: str, name: str | None = None) -> str:
    return (f"/apis/multiworker.dev/v1alpha1/namespaces/{namespace}/multiworkerjobs"
            + (f"/{name}" if name else ""))


_SURROGATES = re.compile(r"\\ud([89ab][0-9a-f]{2})\\ud([c-f][0-9a-f]{2})")


def as_yaml(manifest: Obj) -> bytes:
    """JSON that YAML reads as JSON does: YAML has no surrogate-pair escapes, so characters
    beyond the BMP are written as \\U escapes, which it has."""
    def astral(m: re.Match[str]) -> str:
        high, low = int("d" + m.group(1), 16), int("d" + m.group(2), 16)
        return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"
    return _SURROGATES.sub(astral, json.dumps(manifest)).encode()


def apply(rest: Rest, namespace: str, manifest: Obj, manager: str = "chaos") -> Answer:
    """Server-side apply of a MultiWorkerJob (Strict: an unknown field is refused, named)."""
    query = [("fieldManager", manager), ("force", "true"), ("fieldValidation", "Strict")]
    return rest.request("PATCH", jobs_path(namespace, manifest["metadata"]["name"]),
                        as_yaml(manifest), query, APPLY)
