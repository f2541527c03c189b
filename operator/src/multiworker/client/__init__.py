"""The Python client for MultiWorkerJobs, and `kubectl mwj` (plugin.py) built on it.

    from multiworker.client import Client
    job = Client().submit("examples/cpu-job.yaml", workers=2)
    job.follow()                      # a progress bar until it finishes
    for line in job.logs(generation="all"):
        print(line)                   # [worker-1 gen 0] ...

It imports only the API's models (multiworker.api), the kubernetes client, pydantic and
PyYAML: `pip install multiworker` needs neither the operator's dependencies nor TensorFlow.
"""

from multiworker.api.status import GenerationRecord, JobStatus, Phase
from multiworker.client.client import Client
from multiworker.client.errors import (
    ApiError,
    ClientError,
    ClusterUnreachable,
    InvalidJob,
    JobFailed,
    JobNotFound,
    WaitTimeout,
)
from multiworker.client.events import Event
from multiworker.client.job import Job
from multiworker.client.loglines import LogLine
from multiworker.client.progress import ProgressUpdate

__all__ = [
    "ApiError",
    "Client",
    "ClientError",
    "ClusterUnreachable",
    "Event",
    "GenerationRecord",
    "InvalidJob",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobStatus",
    "LogLine",
    "Phase",
    "ProgressUpdate",
    "WaitTimeout",
]
