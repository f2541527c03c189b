from __future__ import annotations

import json
import logging

from multiworker.logs import JsonFormatter, TextFormatter, job_logger


class Capture(logging.Handler):
    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def log_with(formatter: logging.Formatter, emit: object) -> str:
    handler = Capture(formatter)
    logger = logging.getLogger("multiworker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        emit()  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return handler.lines[-1]


def test_text_lines_name_the_job_and_generation() -> None:
    line = log_with(TextFormatter(), lambda: job_logger("ml", "demo", 2).warning("restarting"))
    assert line.endswith("WARNING multiworker [ml/demo gen=2] restarting")


def test_json_lines_carry_job_and_generation_as_fields() -> None:
    line = log_with(JsonFormatter(), lambda: job_logger("ml", "demo", 2).info("x %s", 1))
    entry = json.loads(line)
    assert entry["message"] == "x 1" and entry["level"] == "INFO"
    assert (entry["job"], entry["generation"]) == ("ml/demo", 2)


def test_kopf_object_records_name_their_object() -> None:
    ref = {"kind": "Pod", "namespace": "ml", "name": "demo-worker-0"}
    logger = logging.getLogger("multiworker")
    text = log_with(TextFormatter(), lambda: logger.warning("odd", extra={"k8s_ref": ref}))
    assert "[ml/demo-worker-0] odd" in text
    entry = json.loads(log_with(JsonFormatter(),
                                lambda: logger.warning("odd", extra={"k8s_ref": ref})))
    assert entry["pod"] == "ml/demo-worker-0" and "k8s_ref" not in entry
