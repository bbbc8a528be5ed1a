{{/*
The fleet file (qlm/serve/config.py, ServeConfig) the qlm processes read with --config.

One file for the API and the controller (every model's weights in engine.vllm.models) and one
per pool for its agents: the same fleet, with the pool's engine overrides and only the pool's
models in engine.vllm.models. Every file lists every instance, because the controller plans
for all of them and an agent looks its own instance up by id (the pod name).
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
    "instances" (include "qlm.instances" $root | fromYamlArray)
-}}
{{- $file := dict
    "qlm" $v.qlm
    "queue" (dict "url_env" "QLM_QUEUE_URL" "key_prefix" $v.fleet.queueKeyPrefix)
    "api" $api
    "controller" $v.controller.settings
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
{{- range $ordinal := until (int $pool.replicas) -}}
{{- $id := printf "%s-%d" (include "qlm.poolName" (list $root $pool)) $ordinal -}}
{{- $instances = append $instances (dict "id" $id "gpu_type" $pool.gpuType "gpu_count" (int $pool.gpusPerInstance) "model" (include "qlm.initialModel" $pool)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $instances -}}
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
{{- $engine := dict "kind" $v.engine.kind "speedup" $v.engine.speedup "seed" $v.engine.seed "output_length" $v.engine.output_length "vllm" $vllm -}}
{{- toYaml $engine -}}
{{- end -}}
