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

{{/* The egress proxy renders for the release's pool when it has an allowlist. */}}
{{- define "mango.egressEnabled" -}}
{{- if and .Values.pool.enabled .Values.pool.egress.allow }}true{{ end }}
{{- end }}

{{- define "mango.egressName" -}}
{{- printf "%s-egress" (include "mango.fullname" .) }}
{{- end }}

{{/* host:port of the proxy's Service, as the WorkerPool's spec.egress.proxy names it. */}}
{{- define "mango.egressProxy" -}}
{{- printf "%s.%s.svc:%d" (include "mango.egressName" .) .Release.Namespace (int .Values.egressProxy.port) }}
{{- end }}

{{/*
The distinct ports of pool.egress.allow, as a JSON list of numbers;
refuses at render, naming the entry, what the controller would refuse too:
a URL, an IP address, a port outside 1–65535, a misplaced `*`, and a
wildcard over a whole top-level domain or everything without allowAny.
The controller checks every entry in full (controller/src/egress/allow.rs).
*/}}
{{- define "mango.egressPorts" -}}
{{- $ports := list }}
{{- range .Values.pool.egress.allow }}
{{- $entry := trim . }}
{{- $why := printf "pool.egress.allow entry %q" . }}
{{- if not $entry }}
{{- fail (printf "%s: is empty" $why) }}
{{- end }}
{{- if or (contains "/" $entry) (hasPrefix "[" $entry) }}
{{- fail (printf "%s: takes a name and an optional port (host[:port]), not a URL or an IP address" $why) }}
{{- end }}
{{- $host := $entry }}
{{- $port := 443 }}
{{- if contains ":" $entry }}
{{- $parts := splitList ":" $entry }}
{{- $text := last $parts }}
{{- $host = join ":" (initial $parts) }}
{{- if not (regexMatch "^[0-9]{1,5}$" $text) }}
{{- fail (printf "%s: port %q is not a number 1..=65535" $why $text) }}
{{- end }}
{{- $port = atoi $text }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "%s: port %d is outside 1..=65535" $why $port) }}
{{- end }}
{{- end }}
{{- if contains ":" $host }}
{{- fail (printf "%s: is an IP address; the allowlist takes names, which the proxy resolves itself" $why) }}
{{- end }}
{{- if regexMatch "^[0-9.]+$" $host }}
{{- fail (printf "%s: is an IP address; the allowlist takes names, which the proxy resolves itself" $why) }}
{{- end }}
{{- $rest := trimPrefix "*." $host }}
{{- if contains "*" (ternary "" $rest (eq $host "*")) }}
{{- fail (printf "%s: `*` is allowed only as the whole leftmost label" $why) }}
{{- end }}
{{- if and (hasPrefix "*" $host) (not $.Values.pool.egress.allowAny) (or (eq $host "*") (not (contains "." $rest))) }}
{{- fail (printf "%s: is a wildcard over a whole top-level domain or everything; name a domain with at least two labels (`*.example.com`), or set pool.egress.allowAny to mean it" $why) }}
{{- end }}
{{- $ports = append $ports $port }}
{{- end }}
{{- $ports | uniq | toJson }}
{{- end }}
