# mypy: disable-error-code="import-untyped"
"""What this worker runs, read from TensorFlow itself, for the preflight (preflight.py).

`tf.sysconfig.get_build_info()` names the CUDA and cuDNN versions TensorFlow was built for
(absent on CPU builds); the GPU model names come from the device details, as CUDA reports
them ("NVIDIA A100-SXM4-40GB").
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform

import tensorflow as tf

from multiworker.api.contract import MWJ_TEST_FINGERPRINT_OVERRIDE
from multiworker.runtime.preflight import Fingerprint, with_override

log = logging.getLogger(__name__)


def collect(override: str | None = None) -> Fingerprint:
    """This worker's fingerprint; `override` (MWJ_TEST_FINGERPRINT_OVERRIDE, tests only)
    replaces fields."""
    build = tf.sysconfig.get_build_info()
    fingerprint = Fingerprint(
        tensorflow=tf.__version__,
        python=platform.python_version(),
        keras=_installed("keras"),
        cuda=_text(build.get("cuda_version")),
        cudnn=_text(build.get("cudnn_version")),
        multiworker=_installed("multiworker"),
        gpu_models=tuple(sorted(_model(gpu) for gpu in tf.config.list_physical_devices("GPU"))),
    )
    if override:
        log.warning("fingerprint changed by %s=%s", MWJ_TEST_FINGERPRINT_OVERRIDE, override)
        fingerprint = with_override(fingerprint, override)
    return fingerprint


def _installed(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _text(value: object) -> str | None:
    return None if value in (None, "") else str(value)


def _model(gpu: tf.config.PhysicalDevice) -> str:
    details = tf.config.experimental.get_device_details(gpu)
    return str(details.get("device_name") or gpu.name)
