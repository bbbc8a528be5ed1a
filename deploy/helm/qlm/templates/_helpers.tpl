{{/*
Names, labels and the pieces every workload shares. Resource names are <fullname>-<part>,
with <fullname> cut to 40 characters so that the longest derived names (StatefulSet pods of a
pool, with their controller-revision-hash label) stay within Kubernetes' 63.
*/}}

{{- define "qlm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "qlm.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "qlm.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: include "qlm.selectorLabels" (list $ "api") */}}
{{- define "qlm.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "qlm.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Every label of one component's objects: include "qlm.labels" (list $ "api") */}}
{{- define "qlm.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "qlm.chart" $root }}
{{ include "qlm.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: qlm
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Image reference: include "qlm.image" (list $ .Values.image) */}}
{{- define "qlm.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion ($image.tag | toString)) -}}
{{- end -}}

{{- define "qlm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ include "qlm.fullname" . }}{{- else -}}default{{- end -}}
{{- end -}}

{{- define "qlm.controllerServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ include "qlm.fullname" . }}-controller{{- else -}}default{{- end -}}
{{- end -}}

{{/* The StatefulSet (and headless Service) name of a pool: include "qlm.poolName" (list $ $pool) */}}
{{- define "qlm.poolName" -}}
{{- printf "%s-pool-%s" (include "qlm.fullname" (index . 0)) (index . 1).name -}}
{{- end -}}

{{- define "qlm.redisName" -}}
{{- printf "%s-redis" (include "qlm.fullname" .) -}}
{{- end -}}

{{/* Secret and key that hold the Redis password; empty name when there is none. */}}
{{- define "qlm.redisSecretName" -}}
{{- if .Values.redis.enabled -}}
{{- default (include "qlm.redisName" .) .Values.redis.auth.existingSecret -}}
{{- else -}}
{{- .Values.redis.externalAuth.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "qlm.redisSecretKey" -}}
{{- if .Values.redis.enabled -}}
{{- if .Values.redis.auth.existingSecret -}}{{ .Values.redis.auth.existingSecretPasswordKey }}{{- else -}}redis-password{{- end -}}
{{- else -}}
{{- .Values.redis.externalAuth.passwordKey -}}
{{- end -}}
{{- end -}}

{{/*
The queue's environment for every qlm container: the password from its Secret, then the URL
built from it (Kubernetes expands $(QLM_REDIS_PASSWORD) in a later variable's value). The fleet
file names QLM_QUEUE_URL in queue.url_env, so the password never enters a ConfigMap.
*/}}
{{- define "qlm.queueEnv" -}}
{{- $secret := include "qlm.redisSecretName" . -}}
{{- if $secret -}}
- name: QLM_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "qlm.redisSecretKey" . }}
{{ end -}}
{{- if and .Values.redis.sentinel.hosts .Values.redis.sentinel.passwordKey }}
- name: QLM_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.externalAuth.existingSecret }}
      key: {{ .Values.redis.sentinel.passwordKey }}
{{ end -}}
- name: QLM_QUEUE_URL
  value: {{ include "qlm.queueUrl" . | quote }}
{{- end -}}

{{- define "qlm.queueUrl" -}}
{{- $auth := ternary ":$(QLM_REDIS_PASSWORD)@" "" (ne (include "qlm.redisSecretName" .) "") -}}
{{- $sentinel := .Values.redis.sentinel -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s%s:%d/%d" $auth (include "qlm.redisName" .) (int .Values.redis.port) (int .Values.redis.db) -}}
{{- else if $sentinel.hosts -}}
{{- printf "redis+sentinel://%s%s/%s/%d" $auth (join "," $sentinel.hosts) $sentinel.service (int $sentinel.db) -}}
{{- else -}}
{{- $url := urlParse .Values.redis.externalUrl -}}
{{- printf "%s://%s%s%s" $url.scheme $auth $url.host $url.path -}}
{{- end -}}
{{- end -}}

{{/* Environment every qlm container shares: a writable HOME on the /tmp emptyDir. */}}
{{- define "qlm.commonEnv" -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* Soft anti-affinity over nodes for a component, used when its affinity is empty. */}}
{{- define "qlm.spreadAffinity" -}}
{{- $root := index . 0 -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "qlm.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* Checksum of the fleet ConfigMap: pods roll when the fleet file changes. */}}
{{- define "qlm.configChecksum" -}}
{{- include (print .Template.BasePath "/configmap-fleet.yaml") . | sha256sum -}}
{{- end -}}
