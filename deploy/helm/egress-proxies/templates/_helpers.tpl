{{/*
The names are the kustomize base's (deploy/), not derived from the release's name: one release
per cluster (the CRD and the Proxies the watcher follows are cluster-wide), and a cluster that
ran the kustomize base can adopt the same objects under Helm (docs/kubernetes.md, "Helm").
*/}}

{{/* The services, in the order of deploy/kustomization.yaml. */}}
{{- define "egress-proxies.services" -}}
watcher reconciler executor health gc discovery pools gateway
{{- end }}

{{/* The ServiceAccount a service runs as: those with Kubernetes API access have their own. */}}
{{- define "egress-proxies.serviceAccount" -}}
{{- if has . (list "watcher" "executor" "gc") -}}
egress-{{ . }}
{{- else -}}
egress-no-api
{{- end }}
{{- end }}

{{/* Whether a service calls the Kubernetes API (its pods get a token, its policy the API). */}}
{{- define "egress-proxies.usesKubeApi" -}}
{{- if has . (list "watcher" "executor" "gc") }}true{{ end }}
{{- end }}

{{- define "egress-proxies.chart" -}}
{{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The labels every object carries. */}}
{{- define "egress-proxies.labels" -}}
app.kubernetes.io/part-of: egress-proxies
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "egress-proxies.chart" . }}
{{- end }}

{{/* The selector of a service's pods (call with the service's name): kustomize's, unchanged. */}}
{{- define "egress-proxies.selectorLabels" -}}
app.kubernetes.io/name: egress-{{ . }}
{{- end }}

{{- define "egress-proxies.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
