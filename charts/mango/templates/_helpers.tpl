{{/* Names, labels and checks shared by the templates. */}}

{{- define "mango.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
<release>-mango, or the release name alone when it already says mango;
fullnameOverride replaces it. Object names append -api, -controller, ….
*/}}
{{- define "mango.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "mango.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; `component` names the part. */}}
{{- define "mango.labels" -}}
helm.sh/chart: {{ include "mango.chart" .root }}
{{ include "mango.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: mango
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels a component's Pods are selected by. */}}
{{- define "mango.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mango.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* repository:tag, or repository@digest when `image.digest` is set (a digest names one image, whatever the tag). */}}
{{- define "mango.image" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* The api as the cluster reaches it: its Service's DNS name. */}}
{{- define "mango.apiUrl" -}}
{{- printf "http://%s-api.%s.svc:%d" (include "mango.fullname" .) .Release.Namespace (int .Values.api.port) }}
{{- end }}

{{- define "mango.sandboxApiUrl" -}}
{{- printf "http://%s-api.%s.svc:%d" (include "mango.fullname" .) .Release.Namespace (int .Values.api.sandboxPort) }}
{{- end }}

{{- define "mango.postgresqlName" -}}
{{- printf "%s-postgresql" (include "mango.fullname" .) }}
{{- end }}

{{/* The Secret and key holding MANGO_DATABASE_URL; fails on a wrong choice. */}}
{{- define "mango.databaseSecret" -}}
{{- if and .Values.postgresql.enabled .Values.database.existingSecret }}
{{- fail "database.existingSecret and postgresql.enabled are both set: choose your PostgreSQL (existingSecret, with postgresql.enabled=false) or the bundled trial one" }}
{{- else if .Values.database.existingSecret }}
name: {{ .Values.database.existingSecret }}
key: {{ .Values.database.existingSecretKey }}
{{- else if .Values.postgresql.enabled }}
name: {{ include "mango.postgresqlName" . }}
key: database-url
{{- else }}
{{- fail "no database: set database.existingSecret to a Secret holding your PostgreSQL URL, or postgresql.enabled=true for a trial" }}
{{- end }}
{{- end }}

{{/* The hardened container security context (Pod Security Standard `restricted`, read-only root). */}}
{{- define "mango.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* A Pod security context for user/group `uid`. */}}
{{- define "mango.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end }}
