{{/*
The operator's least-privilege rules, with the reason for each. Used by rbac.yaml: as one
ClusterRole when cluster-wide, or as a Role in every watched namespace plus a small
ClusterRole for what is cluster-scoped by nature.
*/}}

{{/* Rules for the namespaced objects the operator reads and writes. */}}
{{- define "mwo.rbac.namespacedRules" -}}
# The jobs: kopf watches them and patches its progress annotations and finalizer onto them;
# the operator deletes a finished job once its ttlSecondsAfterFinished has passed.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs]
  verbs: [get, list, watch, patch, update, delete]
# The job's status (phase, conditions, restarts), written through the status subresource.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs/status]
  verbs: [get, patch, update]
# Worker pods and the Service are owned by their job with blockOwnerDeletion; where the
# OwnerReferencesPermissionEnforcement admission plugin runs, that needs update on finalizers.
- apiGroups: [multiworker.dev]
  resources: [multiworkerjobs/finalizers]
  verbs: [update]
# Worker pods: created per generation, deleted on a group restart or when the job ends.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete]
# The headless Service that gives workers their stable DNS names for TF_CONFIG.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, delete]
# Events on jobs: kopf posts core/v1 events for handler outcomes; the operator may use either
# API. patch lets a repeated event be counted instead of duplicated.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
# Read-only check that a job's checkpoint claim exists before its pods reference it.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Gang scheduling (spec.gang): one PodGroup per group generation, created with the workers and
# deleted with them. Harmless where the PodGroup CRD is not installed.
- apiGroups: [scheduling.x-k8s.io]
  resources: [podgroups]
  verbs: [get, list, watch, create, delete]
{{- end }}

{{/* Rules kopf needs cluster-wide in every mode. */}}
{{- define "mwo.rbac.frameworkRules" -}}
# kopf scans CRDs at start-up and watches them to learn which resources it serves.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end }}

{{/* Namespaced mode only: kopf lists and watches namespaces to follow the watched ones. */}}
{{- define "mwo.rbac.namespaceRules" -}}
# kopf lists and watches namespaces to notice a watched namespace being deleted or recreated
# (cluster-wide mode never does).
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}

{{/* HA only: the peering objects kopf keeps its keep-alives in (see peering.yaml). */}}
{{- define "mwo.rbac.peeringRules" -}}
# kopf peering (replicaCount > 1): each pod watches the peering object and patches its own
# keep-alive (priority, lifetime, last seen) into it; the highest live priority works.
- apiGroups: [kopf.dev]
  resources: [{{ . }}]
  verbs: [get, list, watch, patch]
{{- end }}
