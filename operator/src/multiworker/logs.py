"""Logging: every line about a job names it (namespace/name) and its group generation.

`job_logger` attaches the job to records as extras; the formatters print them — as a
`[ns/name gen=N]` prefix in text, as fields in JSON. kopf's own per-object records (which
carry `k8s_ref`) get the same treatment.
"""

from __future__ import annotations

import json
import logging
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_KOPF_INTERNAL = {"k8s_ref", "k8s_skip", "settings"}


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the job (and generation) to every record, merged with the caller's extras."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def job_logger(namespace: str, name: str, generation: int | None = None) -> JobLogger:
    extra: dict[str, Any] = {"job": f"{namespace}/{name}"}
    if generation is not None:
        extra["generation"] = generation
    return JobLogger(logging.getLogger("multiworker"), extra)


def _subject(record: logging.LogRecord) -> tuple[str, str] | None:
    """("job", "ns/name") for our records; (kind, "ns/name") for kopf's per-object ones."""
    job = getattr(record, "job", None)
    if job is not None:
        return "job", str(job)
    ref = getattr(record, "k8s_ref", None)
    if isinstance(ref, dict):
        name = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref.get("name")
        return str(ref.get("kind") or "object").lower(), str(name)
    return None


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        subject = _subject(record)
        if subject is not None:
            generation = getattr(record, "generation", None)
            tag = f"[{subject[1]}" + (f" gen={generation}]" if generation is not None else "]")
            record = logging.makeLogRecord({**vars(record), "message": f"{tag} {record.message}"})
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, job, generation, extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        subject = _subject(record)
        if subject is not None:
            entry[subject[0]] = subject[1]
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _KOPF_INTERNAL and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(log_format: str, level: str) -> None:
    """Send every log line (ours and kopf's) to stderr in `log_format` (text or json)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The kubernetes client's urllib3 is chatty at debug level; keep it to warnings.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    if root.level > logging.DEBUG:
        # Every liveness probe would log twice (kopf's probe activity, aiohttp's access log).
        for chatty in ("kopf.activities.probe", "aiohttp.access"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
