{{/*
Names, labels and the pieces several templates share.
*/}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: <release>-switchyard, or the release name alone when it already says
switchyard. Kubernetes names are limited to 63 characters.
*/}}
{{- define "switchyard.fullname" -}}
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

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret whose keys become the pods' environment. */}}
{{- define "switchyard.secretName" -}}
{{- if .Values.secrets.create }}
{{- include "switchyard.fullname" . }}
{{- else }}
{{- required "secrets.existingSecret is required when secrets.create is false" .Values.secrets.existingSecret }}
{{- end }}
{{- end }}

{{/*
Processes serving the same models: what the RouteWise single-process guard compares against
(SWITCHYARD_REPLICAS). With autoscaling, the most there can be.
*/}}
{{- define "switchyard.replicas" -}}
{{- if .Values.autoscaling.enabled }}
{{- .Values.autoscaling.maxReplicas }}
{{- else }}
{{- .Values.replicaCount }}
{{- end }}
{{- end }}

{{- define "switchyard.sharedDatabase" -}}
{{- if or .Values.postgresql.enabled .Values.externalDatabase.url .Values.externalDatabase.existingSecret }}true{{ end }}
{{- end }}

{{- define "switchyard.fleet" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret }}true{{ end }}
{{- end }}

{{/* Where the SQLite file lives when no PostgreSQL is configured: the data volume. */}}
{{- define "switchyard.sqliteUrl" -}}
sqlite:///var/lib/switchyard/switchyard.db
{{- end }}

{{/*
The config file: .Values.config with the keys the chart owns set from the other values. The
database and Redis URLs hold passwords, so the file names environment variables the Deployment
fills from Secrets.
*/}}
{{- define "switchyard.config" -}}
{{- $config := deepCopy .Values.config }}
{{- $server := deepCopy (default dict $config.server) }}
{{- $_ := set $server "listen" (printf "0.0.0.0:%v" .Values.service.port) }}
{{- if .Values.metrics.enabled }}
{{- $_ := set $server "metrics_listen" (printf "0.0.0.0:%v" .Values.metrics.port) }}
{{- else }}
{{- $_ := unset $server "metrics_listen" }}
{{- end }}
{{- $_ := set $config "server" $server }}
{{- $database := deepCopy (default dict $config.database) }}
{{- $_ := set $database "url" "${SWITCHYARD_DATABASE_URL}" }}
{{- $_ := set $config "database" $database }}
{{- if include "switchyard.fleet" . }}
{{- $_ := set $config "fleet" (dict "redis_url" "${SWITCHYARD_REDIS_URL}" "key_prefix" .Values.externalRedis.keyPrefix) }}
{{- else }}
{{- $_ := unset $config "fleet" }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
Refuse value combinations that would deploy something broken, with the value to change.
*/}}
{{- define "switchyard.validate" -}}
{{- if and .Values.persistence.enabled (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) }}
{{- fail "persistence.enabled keeps the SQLite file on one ReadWriteOnce volume, which serves one replica: set replicaCount to 1 and autoscaling.enabled to false, or use PostgreSQL (externalDatabase or postgresql.enabled) and leave persistence off" }}
{{- end }}
{{- if and .Values.postgresql.enabled (or .Values.externalDatabase.url .Values.externalDatabase.existingSecret) }}
{{- fail "postgresql.enabled and externalDatabase both name a database: choose one" }}
{{- end }}
{{- if and .Values.redis.enabled (or .Values.externalRedis.url .Values.externalRedis.existingSecret) }}
{{- fail "redis.enabled and externalRedis both name a Redis: choose one" }}
{{- end }}
{{- if and (not .Values.secrets.create) (or .Values.externalDatabase.url .Values.externalRedis.url) }}
{{- fail "externalDatabase.url and externalRedis.url are stored in the chart's Secret, and secrets.create is false: put the URL in your Secret and name it with externalDatabase.existingSecret / externalRedis.existingSecret" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.enabled) }}
{{- fail "serviceMonitor.enabled scrapes the metrics port: set metrics.enabled too" }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.service.port) }}
{{- fail "metrics.port must differ from service.port (the metrics listener is a second listener)" }}
{{- end }}
{{- end }}
