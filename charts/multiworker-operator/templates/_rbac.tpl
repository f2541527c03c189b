{{/*
The operator's least-privilege rules: exactly the calls its code makes (listed in operator/src/
multiworker/clients/footprint.py), with the reason for each. Used by
rbac.yaml: as one ClusterRole when cluster-wide, or as a Role in every watched namespace plus a
ClusterRole for what is cluster-scoped by nature. tests/unit/test_chart.py checks this list
against the code's REST calls; the e2e suite runs the operator under it.
*/}}

{{/* Rules for the namespaced objects the operator reads and writes. */}}
{{- define "mwo.rbac.namespacedRules" -}}
# The jobs: listed and watched into the operator's cache; a finished job is deleted once its
# ttlSecondsAfterFinished has passed.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs]
  verbs: [list, watch, delete]
# The job's status (phase, conditions, restarts), merge-patched through the subresource.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs/status]
  verbs: [patch]
# Worker pods and the Service are owned by their job with blockOwnerDeletion; where the
# OwnerReferencesPermissionEnforcement admission plugin runs, that needs update on finalizers.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs/finalizers]
  verbs: [update]
# Worker pods: watched (label-selected) into the cache, created per generation, deleted on a
# group restart or when the job ends; get only when a create finds the name taken; patched
# (labels, annotations) to restart a group in place. A restarting group's pods go by label
# selector, 8 to a call (deletecollection: no pod that list + delete could not reach anyway).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete, deletecollection]
# The headless Service that gives workers their DNS names; get only when the name is taken.
- apiGroups: [""]
  resources: [services]
  verbs: [get, create]
# The ConfigMap every worker's TF_CONFIG takes the group's addresses from, one per job (its
# name says what it holds): created, never read, so no ConfigMap of anyone's is readable.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
# In-place jobs (restartPolicy.mode InPlace): a Secret per job holding the key the operator
# signs its notes to the pods' restart agents with, owned by the job and mounted into the
# agent sidecar alone. Created before the pods; read by name when a pass signs notes (the
# operator keeps no copy, so a new leader signs as the old one did). Never listed or watched:
# no other Secret is ever sent to the operator. Without the key anyone able to list pods could
# forge a note that restarts a pod into a generation the operator never released.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create]
# Events on jobs (what `kubectl describe mwj` shows).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Leader election: the Lease multiworker-operator in each namespace with jobs, and no other
# (kube-system's leader Leases stay out of reach). A create cannot be limited by name: the API
# server authorizes it before the object has one.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [create]
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  resourceNames: [multiworker-operator]
  verbs: [get, update]
# Gang scheduling (spec.gang): a PodGroup per generation, created before its pods and deleted
# with them; get for its status in the waiting message and when its name is taken.
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, create, delete]
# workerNetworkPolicy.enabled (--worker-network-policy): a NetworkPolicy per job, owned by it;
# get only when a create finds the name taken.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create]
{{- if .Values.kueue.enabled }}
# kueue.enabled (--kueue): each queued job's Workload, watched (label-selected) into the
# cache, created before any pod, deleted when an edit replaces it, its finalizer dropped
# (patch) once the job is done; its status written: the admission cleared after an eviction
# (which returns the quota), PodsReady, Finished.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, watch, create, delete, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
# A waiting job's LocalQueue, read for the ClusterQueue its condition names.
- apiGroups: [kueue.x-k8s.io]
  resources: [localqueues]
  verbs: [get]
{{- end }}
{{- end }}

{{/* Rules for cluster-scoped objects, in every mode. */}}
{{- define "mwo.rbac.clusterRules" -}}
# Nodes: watched so that a worker on a NotReady or unreachable node restarts its group in
# seconds, and a stale pod is force-deleted only when its node is gone; read once more (get)
# before either, since the watch may lag a node that came back.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
# spec.elastic: the pods bound to a node, in every namespace (list, by field selector), to
# tell whether a shrunk group has room to grow back: what other tenants' pods hold there.
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- if .Values.kueue.enabled }}
# kueue.enabled: the admitted ResourceFlavors' node labels and tolerations go to every
# worker; a priority class's value becomes the Workload's priority.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}
{{- end }}

{{/* Rules in kube-node-lease, in every mode: the nodes' heartbeats. */}}
{{- define "mwo.rbac.nodeLeaseRules" -}}
# Node Leases: watched so that a worker whose node stopped renewing its Lease (every 10 s)
# restarts its group long before the node turns NotReady (50 s), and read once more before
# acting on one that looks silent; read only, in this namespace.
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch]
{{- end }}
