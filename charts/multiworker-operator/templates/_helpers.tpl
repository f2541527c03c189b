{{/* Names, labels and the operator's mode: one source for every template. */}}

{{- define "mwo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: fullnameOverride, RELEASE, or RELEASE-NAME. */}}
{{- define "mwo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "mwo.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Name of cluster-scoped objects (ClusterRole, ClusterRoleBinding): release names are unique only
per namespace, so the namespace is part of the name.
*/}}
{{- define "mwo.clusterName" -}}
{{- printf "%s:%s" .Release.Namespace (include "mwo.fullname" .) }}
{{- end }}

{{- define "mwo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mwo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mwo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "mwo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: multiworker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "mwo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mwo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "mwo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* "true" when the operator runs cluster-wide (no watchNamespaces), else "". */}}
{{- define "mwo.clusterWide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/* The operator's command-line arguments, one per line as a YAML list. */}}
{{- define "mwo.args" -}}
{{- if include "mwo.clusterWide" . }}
- --all-namespaces
{{- else }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- end }}
- --health-port={{ .Values.health.port }}
- --metrics-port={{ .Values.metrics.port }}
- --log-level={{ .Values.logging.level }}
- --log-format={{ .Values.logging.format }}
- --kube-api-qps={{ .Values.kubeApi.qps }}
- --kube-api-burst={{ .Values.kubeApi.burst }}
- --request-timeout={{ .Values.kubeApi.requestTimeoutSeconds }}
- --api-concurrency={{ .Values.kubeApi.concurrency }}
- --workers={{ .Values.reconcileWorkers }}
{{- if .Values.gangScheduling.default }}
- --default-gang-scheduling
{{- end }}
{{- if .Values.workerNetworkPolicy.enabled }}
- --worker-network-policy
{{- end }}
{{- if .Values.kueue.enabled }}
- --kueue
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
