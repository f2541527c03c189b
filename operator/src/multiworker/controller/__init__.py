"""The controller: watch-fed caches → a work queue → reconcile passes, plus the progress
poller and leader election. The one place that decides *when* a job is looked at.

Its pieces: controller.py wires them (the informers feeding the caches, their events waking
jobs on the work queue, the namespaces led); passes.py runs the passes and acts on what they
return; workloads.py lets go of the Kueue Workloads of jobs that are gone. The caches
(reconcile/view.py), the work queue (clients/workqueue.py), leader election
(clients/leader.py) and the poller (clients/poller.py) are their own modules below.
"""

from multiworker.controller.controller import Controller

__all__ = ["Controller"]
