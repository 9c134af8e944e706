{{/*
The chart name, or nameOverride.
*/}}
{{- define "floodgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release name when it
already contains the chart name, else "<release>-<chart>". Kept to 63 characters, the
longest DNS label.
*/}}
{{- define "floodgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "floodgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "floodgate.labels" -}}
helm.sh/chart: {{ include "floodgate.chart" . }}
{{ include "floodgate.selectorLabels" . }}
app.kubernetes.io/version: {{ include "floodgate.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The labels that select the pods; they never change across upgrades.
*/}}
{{- define "floodgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "floodgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "floodgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "floodgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "floodgate.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The ConfigMap holding the rule files: the chart's, or existingConfigMap.
*/}}
{{- define "floodgate.rulesConfigMap" -}}
{{- .Values.existingConfigMap | default (printf "%s-rules" (include "floodgate.fullname" .)) }}
{{- end }}

{{/*
Whether the chart configures Redis: any backend but memory, unless upstreamCompat hands the
configuration to envoyproxy/ratelimit's variables.
*/}}
{{- define "floodgate.usesRedis" -}}
{{- if and (ne .Values.backend "memory") (not .Values.upstreamCompat.enabled) }}true{{ end }}
{{- end }}

{{/*
The Secret holding the Redis URL and password: existingSecret.name, or the chart's.
*/}}
{{- define "floodgate.redisSecret" -}}
{{- .Values.redis.existingSecret.name | default (printf "%s-redis" (include "floodgate.fullname" .)) }}
{{- end }}

{{/*
"host:port" for a listen address; an IPv6 host gets brackets.
*/}}
{{- define "floodgate.listen" -}}
{{- $host := index . 0 }}
{{- if contains ":" $host }}[{{ $host }}]:{{ index . 1 }}{{ else }}{{ $host }}:{{ index . 1 }}{{ end }}
{{- end }}

{{/*
The `settings` map as FLOODGATE_* EnvVars, nested maps joined with "__". Called with
(list prefix map).
*/}}
{{- define "floodgate.settingsEnv" -}}
{{- $prefix := index . 0 }}
{{- range $key, $value := index . 1 }}
{{- $name := printf "%s%s" $prefix (upper $key) }}
{{- if kindIs "map" $value }}
{{- include "floodgate.settingsEnv" (list (printf "%s__" $name) $value) }}
{{- else }}
- name: {{ $name }}
  value: {{ include "floodgate.envValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A settings value as its environment text. Whole numbers print without an exponent: values
reach templates as floats, and 1000000 would otherwise read "1e+06".
*/}}
{{- define "floodgate.envValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) }}
{{- int64 . }}
{{- else }}
{{- toString . }}
{{- end }}
{{- end }}

{{/*
The PromQL label matchers that select this release's floodgate series: prometheusRule.selector,
or the namespace and the job label the chart's ServiceMonitor gives them (the Service's name).
*/}}
{{- define "floodgate.metricSelector" -}}
{{- .Values.prometheusRule.selector | default (printf "namespace=%q,job=%q" .Release.Namespace (include "floodgate.fullname" .)) }}
{{- end }}

{{/*
An alert's `for` and labels: its severity, then prometheusRule.alertLabels. Called with
(list root alert).
*/}}
{{- define "floodgate.alertMeta" -}}
{{- $root := index . 0 }}
{{- $alert := index . 1 -}}
for: {{ $alert.for }}
labels:
  {{- toYaml (merge (dict "severity" $alert.severity) $root.Values.prometheusRule.alertLabels) | nindent 2 }}
{{- end }}

{{/*
"true" when an unready pod is one whose backend circuit is open: the setting
readiness_follows_backend, or upstream's REDIS_HEALTH_CHECK_ACTIVE_CONNECTION (a Go boolean)
under upstreamCompat.
*/}}
{{- define "floodgate.readinessFollowsBackend" -}}
{{- $setting := dig "readiness_follows_backend" false .Values.settings | toString }}
{{- $upstream := "" }}
{{- if .Values.upstreamCompat.enabled }}
{{- $upstream = dig "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION" "" .Values.upstreamCompat.env | toString }}
{{- end }}
{{- if or (eq $setting "true") (has $upstream (list "1" "t" "T" "true" "TRUE" "True")) }}true{{ end }}
{{- end }}
