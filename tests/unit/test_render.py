from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from multiworker.api import names
from multiworker.api.job import Job
from multiworker.reconcile import render
from multiworker.reconcile.render import (
    owner_reference,
    pod_digest,
    render_cluster_config,
    render_service,
    render_worker_pod,
    tf_config,
)

from tests.unit.builders import JOB, NAMESPACE, job_body, make_job


def env_of(pod: dict[str, Any], container: str = "tensorflow",
           config_maps: Sequence[dict[str, Any]] = ()) -> dict[str, str]:
    """The trainer's environment as its process sees it: resolved the way the kubelet does
    (a ConfigMap key or the pod's own field for valueFrom, then $(VAR) of earlier variables
    expanded; an unknown reference stays as written; a key of a ConfigMap not given is left
    out)."""
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == container)
    data = {(c["metadata"]["name"], k): v for c in config_maps for k, v in c["data"].items()}
    env: dict[str, str] = {}
    for e in trainer["env"]:
        if "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            assert label or path == "spec.nodeName", path
            env[e["name"]] = pod["metadata"]["labels"][label[1]] if label \
                else pod["spec"].get("nodeName", "")
        elif "valueFrom" in e:
            ref = e["valueFrom"]["configMapKeyRef"]
            if (ref["name"], ref["key"]) in data:
                env[e["name"]] = data[(ref["name"], ref["key"])]
        else:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m[1], m[0]), e.get("value", ""))
    return env


def env_of_job(job: Job, index: int, generation: int = 0) -> dict[str, str]:
    owner = owner_reference(job)
    return env_of(render_worker_pod(job, index, generation, owner, agent=True),
                  config_maps=[render_cluster_config(job, owner)])


@pytest.mark.parametrize("index", [0, 2])
def test_tf_config_is_understood_by_tensorflow(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow as tf  # slow to import: only here

    job = make_job(workers=3, port=2345)
    monkeypatch.setenv("TF_CONFIG", env_of_job(job, index)["TF_CONFIG"])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    assert resolver.cluster_spec().as_dict()["worker"] == [
        f"demo-worker-{i}.demo.ml.svc:2345" for i in range(3)
    ]
    assert resolver.task_type == "worker"
    assert resolver.task_id == index


def test_tf_config_is_data() -> None:
    assert tf_config("j", "ns", 2, 2222, 1) == {
        "cluster": {"worker": ["j-worker-0.j.ns.svc:2222", "j-worker-1.j.ns.svc:2222"]},
        "task": {"type": "worker", "index": 1},
    }


def test_tf_config_as_the_process_sees_it_is_the_rendered_data() -> None:
    job = make_job(workers=5, port=2345)
    for index in range(5):
        assert json.loads(env_of_job(job, index)["TF_CONFIG"]) == \
            tf_config(JOB, NAMESPACE, 5, 2345, index)


def test_a_pod_carries_the_same_bytes_whatever_the_group_size() -> None:
    """The addresses travel once per group, in the ConfigMap; a pod only refers to them."""
    def pod_bytes(workers: int) -> int:
        job = make_job(workers=workers)
        return len(json.dumps(render_worker_pod(job, workers - 1, 0, owner_reference(job))))
    # Only the digits differ (the index in the name, labels and env; the count): a few dozen
    # bytes, where each pod once carried every address (~60 KB at 1,024 workers).
    assert pod_bytes(1024) - pod_bytes(8) < 64
    job = make_job(workers=1024)
    config = render_cluster_config(job, owner_reference(job))
    assert config["metadata"]["name"].startswith("demo-tf-")
    assert config["metadata"]["ownerReferences"] == [owner_reference(job)]
    assert len(json.loads(config["data"]["workers"])) == 1024


def test_an_operator_shipping_another_agent_gives_new_groups_a_new_config_map(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's ConfigMap is created once and never rewritten: after an upgrade whose agent
    differs, new groups must not mount the old script (it ran for the job's lifetime)."""
    job = make_job()
    agent = {"restartPolicy": {"mode": "InPlace"}}

    def references(job: Job) -> set[str]:
        pod = render_worker_pod(job, 0, 0, owner_reference(job), agent=True)
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        volumes = [v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v]
        return {env["MWJ_WORKER_ADDRESSES"]["valueFrom"]["configMapKeyRef"]["name"], *volumes,
                render_cluster_config(job, owner_reference(job))["metadata"]["name"]}

    before = references(make_job(**agent))
    assert len(before) == 1  # the env, the agent's volume and the ConfigMap agree
    shipped = render.shipped_scripts()
    monkeypatch.setattr(render, "shipped_scripts",
                        lambda: {**shipped, "agent.py": "print('another agent')\n"})
    after = references(make_job(**agent))
    assert len(after) == 1 and after != before
    assert render_cluster_config(job, owner_reference(job))["data"]["agent.py"] == \
        "print('another agent')\n"


def test_worker_env_follows_the_contract() -> None:
    job = make_job(workers=4, checkpoint={"claimName": "ckpt", "mountPath": "/ckpt"},
                   health={"progressPort": 9000, "peerTimeoutSeconds": 60,
                           "collectiveTimeoutSeconds": 90})
    env = env_of_job(job, 3, 5)
    assert json.loads(env.pop("TF_CONFIG"))["task"] == {"type": "worker", "index": 3}
    assert json.loads(env.pop("MWJ_WORKER_ADDRESSES")) == [
        f"demo-worker-{i}.demo.ml.svc:2222" for i in range(4)]
    assert env == {
        "MWJ_NODE_NAME": "",  # the kubelet fills it in; the pod is not bound yet
        "MWJ_JOB_NAME": "demo",
        "MWJ_JOB_NAMESPACE": "ml",
        "MWJ_JOB_UID": "uid-demo",
        "MWJ_NUM_WORKERS": "4",
        "MWJ_WORKER_INDEX": "3",
        "MWJ_RESTART_COUNT": "5",  # from the pod's label, as the kubelet reads it
        "MWJ_POD_GENERATION_FILE": "/run/multiworker/pod-generation",
        "MWJ_CHECKPOINT_DIR": "/ckpt/ml/demo-uid-demo",
        "MWJ_PROGRESS_PORT": "9000",
        "MWJ_PEER_TIMEOUT_SECONDS": "60",
        "MWJ_COLLECTIVE_TIMEOUT_SECONDS": "90",
    }


def test_no_checkpoint_dir_without_checkpoint() -> None:
    job = make_job()
    env = env_of(render_worker_pod(job, 0, 0, owner_reference(job)))
    assert "MWJ_CHECKPOINT_DIR" not in env and "MWJ_RESUME_FROM_DIR" not in env


def test_each_job_checkpoints_in_its_own_directory_named_by_uid() -> None:
    """Two jobs on one claim, and a job re-created under the same name, never share one."""
    checkpoint = {"claimName": "shared"}
    first = make_job(checkpoint=checkpoint)
    other = Job.from_body(job_body(name="other", checkpoint=checkpoint))
    recreated = Job.from_body(_with_uid(job_body(checkpoint=checkpoint), "uid-second"))
    dirs = [env_of(render_worker_pod(j, 0, 0, owner_reference(j)))["MWJ_CHECKPOINT_DIR"]
            for j in (first, other, recreated)]
    assert dirs == ["/checkpoints/ml/demo-uid-demo", "/checkpoints/ml/other-uid-demo",
                    "/checkpoints/ml/demo-uid-second"]


def test_resume_from_names_a_directory_on_the_claim() -> None:
    job = make_job(checkpoint={"claimName": "c", "mountPath": "/ckpt/",
                               "resumeFrom": "ml/demo-uid-first"})
    for index, generation in [(0, 0), (2, 3)]:
        env = env_of(render_worker_pod(job, index, generation, owner_reference(job)))
        assert env["MWJ_CHECKPOINT_DIR"] == "/ckpt/ml/demo-uid-demo"
        assert env["MWJ_RESUME_FROM_DIR"] == "/ckpt/ml/demo-uid-first"
    root = make_job(checkpoint={"claimName": "c", "resumeFrom": "."})
    env = env_of(render_worker_pod(root, 0, 0, owner_reference(root)))
    assert env["MWJ_RESUME_FROM_DIR"] == "/checkpoints"  # the layout of earlier versions


def _with_uid(body: dict[str, Any], uid: str) -> dict[str, Any]:
    body["metadata"]["uid"] = uid
    return body


def test_worker_pod_identity_and_ownership() -> None:
    job = make_job(workers=2)
    owner = owner_reference(job)
    pod = render_worker_pod(job, 1, 4, owner)
    assert pod["metadata"]["name"] == "demo-worker-1"
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert pod["metadata"]["labels"] == names.worker_labels(JOB, 1, 4)
    assert pod["metadata"]["ownerReferences"] == [owner]
    assert owner["controller"] is True and owner["uid"] == job.uid
    assert pod["spec"]["hostname"] == "demo-worker-1"
    assert pod["spec"]["subdomain"] == "demo"
    assert pod["spec"]["restartPolicy"] == "Never"


def test_template_is_kept_and_only_the_trainer_gets_the_env() -> None:
    template = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [
                {"name": "sidecar", "image": "s"},
                {"name": "tensorflow", "image": "t",
                 "resources": {"limits": {"nvidia.com/gpu": 2}},
                 "env": [{"name": "TF_CONFIG", "value": "mine"}, {"name": "USER_VAR", "value": "1"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
            ],
        },
    }
    job = make_job(template=template, checkpoint={"claimName": "ckpt"})
    pod = render_worker_pod(job, 0, 0, owner_reference(job), agent=True)
    sidecar, trainer = pod["spec"]["containers"]
    assert "env" not in sidecar
    assert trainer["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    names_in_order = [e["name"] for e in trainer["env"]]
    assert names_in_order[-1] == "USER_VAR" and names_in_order.count("TF_CONFIG") == 1
    assert env_of(pod)["TF_CONFIG"] != "mine"
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert trainer["volumeMounts"][-1] == {"name": "mwj-checkpoint", "mountPath": "/checkpoints"}
    assert pod["spec"]["volumes"][-1] == {
        "name": "mwj-checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}
    }
    assert pod["spec"]["terminationGracePeriodSeconds"] == 5
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["annotations"] == {
        "note": "x", "multiworker.dev/trainer-container": "tensorflow",
        "multiworker.dev/progress-port": "8471",  # what the pod is judged by, as created
        "multiworker.dev/released-generation": "0", "multiworker.dev/trainer-restarts": "0",
        "multiworker.dev/pod-digest": pod_digest(job, None)}
    # The job's own template is untouched.
    assert "hostname" not in job.spec.template.as_dict()["spec"]


def test_headless_service() -> None:
    job = make_job(port=3000)
    service = render_service(job, owner_reference(job))
    assert service["metadata"]["name"] == "demo"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"multiworker.dev/job-name": "demo"}
    assert service["spec"]["ports"][0]["port"] == 3000
    assert service["metadata"]["ownerReferences"][0]["uid"] == job.uid


def test_a_group_avoids_nodes_whose_lease_went_silent_in_every_required_term() -> None:
    """Required node-affinity terms are ORed: the exclusion must be in each, or a template's
    own term would let the pod onto the silent node."""
    job = make_job()
    bare = render_worker_pod(job, 0, 1, owner_reference(job), avoid_nodes=["n1", "n2"])
    assert bare["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}]}]
    zones = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": [z]}]}
             for z in ("a", "b")]
    job = make_job(template={"spec": {"containers": [{"name": "tensorflow", "image": "w"}],
                                      "affinity": {"nodeAffinity": {
                                          "requiredDuringSchedulingIgnoredDuringExecution": {
                                              "nodeSelectorTerms": zones}}}}})
    pod = render_worker_pod(job, 0, 1, owner_reference(job), avoid_nodes=["n1"])
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
    assert all(t["matchFields"] == [{"key": "metadata.name", "operator": "NotIn",
                                     "values": ["n1"]}] for t in terms)
    plain = render_worker_pod(job, 0, 1, owner_reference(job))  # nothing silent: as written
    assert plain["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == zones
    # The pod says what it avoids: a pass places the group again once one of them is back.
    assert pod["metadata"]["annotations"][names.ANNOTATION_AVOIDED_NODES] == "n1"
    assert bare["metadata"]["annotations"][names.ANNOTATION_AVOIDED_NODES] == "n1,n2"
    assert names.ANNOTATION_AVOIDED_NODES not in plain["metadata"]["annotations"]
