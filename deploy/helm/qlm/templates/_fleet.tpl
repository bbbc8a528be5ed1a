{{/*
The fleet file (qlm/config/serve_config.py, ServeConfig) the qlm processes read with --config.

One file for the API and the controller (every model's weights in engine.vllm.models) and one
per pool for its agents: the same fleet, with the pool's engine overrides and only the pool's
models in engine.vllm.models. Every file lists every instance, because the controller plans
for all of them and an agent looks its own instance up by id (the pod name). An autoscaled
pool lists maxReplicas instances (the pods it may have); those without a pod never report, and
the controller plans only onto instances that report.
*/}}

{{/* include "qlm.fleetFile" (list $ $pool); $pool is nil for the shared file. */}}
{{- define "qlm.fleetFile" -}}
{{- $root := index . 0 -}}
{{- $pool := index . 1 -}}
{{- $v := $root.Values -}}
{{- $models := list -}}
{{- range $v.models -}}
{{- $models = append $models (dict "name" .name "max_context_tokens" (int .maxContextTokens)) -}}
{{- end -}}
{{- $api := merge (dict "host" "0.0.0.0" "port" (int $v.api.port)) (deepCopy $v.api.settings) -}}
{{- $gpuTypes := dict -}}
{{- range $name, $gib := $v.fleet.gpuMemoryGiB -}}
{{- $_ := set $gpuTypes $name (dict "memory_gib" $gib) -}}
{{- end -}}
{{- $fleet := dict
    "gpu_types" $gpuTypes
    "packaged_profiles" $v.fleet.packagedProfiles
    "profiles" $v.fleet.profiles
    "model_copies" (default (dict) $v.fleet.modelCopies)
    "instances" (include "qlm.instances" $root | fromYamlArray)
-}}
{{- $file := dict
    "qlm" (include "qlm.qlmConfig" $root | fromYaml)
    "queue" (include "qlm.queueConfig" $root | fromYaml)
    "api" $api
    "controller" (include "qlm.controllerConfig" $root | fromYaml)
    "agent" $v.agent.settings
    "engine" (include "qlm.engineConfig" (list $root $pool) | fromYaml)
    "models" $models
    "fleet" $fleet
-}}
{{- $_ := set $file "metrics" (merge (dict "host" "0.0.0.0" "port" (int $v.metrics.port)) (deepCopy (default (dict) $v.metrics.settings))) -}}
{{- toYaml $file -}}
{{- end -}}

{{/* Every instance of every pool: id = pod name = <pool StatefulSet>-<ordinal>. */}}
{{- define "qlm.instances" -}}
{{- $root := . -}}
{{- $instances := list -}}
{{- range $pool := $root.Values.pools -}}
{{- range $ordinal := until (include "qlm.poolInstanceCount" $pool | int) -}}
{{- $id := printf "%s-%d" (include "qlm.poolName" (list $root $pool)) $ordinal -}}
{{- $instances = append $instances (dict "id" $id "gpu_type" $pool.gpuType "gpu_count" (int $pool.gpusPerInstance) "model" (include "qlm.initialModel" $pool)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $instances -}}
{{- end -}}

{{/*
A pool's autoscaling settings with the defaults filled in: include "qlm.poolAutoscaling" $pool
| fromYaml. Key by key (not mergeOverwrite, which would drop a given 0 or false).
*/}}
{{- define "qlm.poolAutoscaling" -}}
{{- $scaling := dict "enabled" false "minReplicas" 1 "maxReplicas" 4 "via" "hpa" "behavior" (dict) -}}
{{- range $key, $value := (default (dict) .autoscaling) -}}
{{- $_ := set $scaling $key $value -}}
{{- end -}}
{{- toYaml $scaling -}}
{{- end -}}

{{/* Instances (pods) a pool may have: replicas, or maxReplicas when it autoscales. */}}
{{- define "qlm.poolInstanceCount" -}}
{{- $scaling := include "qlm.poolAutoscaling" . | fromYaml -}}
{{- if $scaling.enabled -}}{{ $scaling.maxReplicas | int }}{{- else -}}{{ .replicas | int }}{{- end -}}
{{- end -}}

{{/*
qlm.autoscale.pools (AutoscalePoolConfig, qlm/config/policy_config.py) of the autoscaled pools; the
StatefulSet only for via controller, whose scale the controller sets itself.
*/}}
{{- define "qlm.autoscalePools" -}}
{{- $root := . -}}
{{- $pools := list -}}
{{- range $pool := $root.Values.pools -}}
{{- $scaling := include "qlm.poolAutoscaling" $pool | fromYaml -}}
{{- if $scaling.enabled -}}
{{- $name := include "qlm.poolName" (list $root $pool) -}}
{{- $entry := dict "name" $pool.name "instance_prefix" $name "min_replicas" (int $scaling.minReplicas) "max_replicas" (int $scaling.maxReplicas) -}}
{{- if eq $scaling.via "controller" -}}
{{- $_ := set $entry "statefulset" $name -}}
{{- end -}}
{{- $pools = append $pools $entry -}}
{{- end -}}
{{- end -}}
{{- toYaml $pools -}}
{{- end -}}

{{/* "true" when some pool is scaled by the controller through the Kubernetes API. */}}
{{- define "qlm.controllerScales" -}}
{{- $found := false -}}
{{- range $pool := .Values.pools -}}
{{- $scaling := include "qlm.poolAutoscaling" $pool | fromYaml -}}
{{- if and $scaling.enabled (eq $scaling.via "controller") -}}{{- $found = true -}}{{- end -}}
{{- end -}}
{{- ternary "true" "" $found -}}
{{- end -}}

{{/* The fleet file's qlm section: the values' verbatim, with the autoscaled pools merged into
     qlm.autoscale (its other settings, e.g. target_utilization, kept as given). */}}
{{- define "qlm.qlmConfig" -}}
{{- $qlm := deepCopy (default (dict) .Values.qlm) -}}
{{- $pools := include "qlm.autoscalePools" . | fromYamlArray -}}
{{- if $pools -}}
{{- $autoscale := default (dict) $qlm.autoscale -}}
{{- $_ := set $autoscale "pools" $pools -}}
{{- $_ := set $qlm "autoscale" $autoscale -}}
{{- end -}}
{{- toYaml $qlm -}}
{{- end -}}

{{/* The fleet file's controller section: controller.settings, and kubernetes_scaling when the
     controller sets some pool's scale. */}}
{{- define "qlm.controllerConfig" -}}
{{- $controller := deepCopy (default (dict) .Values.controller.settings) -}}
{{- if include "qlm.controllerScales" . -}}
{{- $_ := set $controller "kubernetes_scaling" true -}}
{{- end -}}
{{- toYaml $controller -}}
{{- end -}}

{{- define "qlm.initialModel" -}}
{{- default (first (default (list "") .models)) .initialModel -}}
{{- end -}}

{{/* The pool's model cache settings: the global ones with the pool's overrides on top. */}}
{{- define "qlm.poolModelCache" -}}
{{- $root := index . 0 -}}
{{- $pool := index . 1 -}}
{{- $cache := deepCopy $root.Values.modelCache -}}
{{- if $pool -}}
{{- $cache = mergeOverwrite $cache (deepCopy (default (dict) $pool.modelCache)) -}}
{{- end -}}
{{- toYaml $cache -}}
{{- end -}}

{{/* Where vLLM loads a model from: a folder (relative to the cache mount) or a repo id. */}}
{{- define "qlm.modelSource" -}}
{{- $model := index . 0 -}}
{{- $mountPath := index . 1 -}}
{{- if $model.repo -}}
{{- $model.repo -}}
{{- else if hasPrefix "/" $model.path -}}
{{- $model.path -}}
{{- else -}}
{{- printf "%s/%s" (trimSuffix "/" $mountPath) $model.path -}}
{{- end -}}
{{- end -}}

{{/* The fleet file's engine section (LiveEngineConfig): the global engine block, the pool's
     vLLM overrides and model folders. */}}
{{- define "qlm.engineConfig" -}}
{{- $root := index . 0 -}}
{{- $pool := index . 1 -}}
{{- $v := $root.Values -}}
{{- $cache := include "qlm.poolModelCache" (list $root $pool) | fromYaml -}}
{{- $vllm := deepCopy $v.engine.vllm -}}
{{- $served := list -}}
{{- range $v.models -}}{{- $served = append $served .name -}}{{- end -}}
{{- if $pool -}}
{{- $vllm = mergeOverwrite $vllm (deepCopy (default (dict) $pool.engine)) -}}
{{- $served = $pool.models -}}
{{- end -}}
{{- $sources := dict -}}
{{- range $v.models -}}
{{- if has .name $served -}}
{{- $_ := set $sources .name (include "qlm.modelSource" (list . $cache.mountPath)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $vllm "models" $sources -}}
{{- $engine := dict "kind" $v.engine.kind "speedup" $v.engine.speedup "seed" $v.engine.seed "output_length" $v.engine.output_length "standby_models" (default 0 $v.engine.standby_models) "vllm" $vllm -}}
{{- toYaml $engine -}}
{{- end -}}

{{/* The fleet file's queue section: the URL from the environment (qlm.queueEnv), the key
prefix, the replicas a write waits for, and where the Sentinels' password is. */}}
{{- define "qlm.queueConfig" -}}
{{- $redis := .Values.redis -}}
{{- $queue := dict "url_env" "QLM_QUEUE_URL" "key_prefix" .Values.fleet.queueKeyPrefix "replicas_to_ack" (int $redis.replicasToAck) -}}
{{- if and $redis.sentinel.hosts $redis.sentinel.passwordKey -}}
{{- $_ := set $queue "sentinel_password_env" "QLM_SENTINEL_PASSWORD" -}}
{{- end -}}
{{- toYaml $queue -}}
{{- end -}}
