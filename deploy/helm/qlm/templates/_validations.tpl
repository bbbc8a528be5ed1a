{{/*
Checks that span several values (values.schema.json checks types and shapes first). Every
problem is collected, then rendering fails once with all of them, each naming the key to fix.
Included at the top of templates/validations.yaml and of every template that reads the values
it checks, so the first template Helm renders already fails with these messages.
*/}}

{{/* GPU types QLM knows without fleet.gpuMemoryGiB (DEFAULT_GPU_TYPES in qlm/types.py). */}}
{{- define "qlm.builtinGpuTypes" -}}
{{- toYaml (list "A10" "A100" "H100") -}}
{{- end -}}

{{- define "qlm.validate" -}}
{{- $errors := list -}}
{{- $errors = concat $errors (include "qlm.validateRedis" . | fromYamlArray) -}}
{{- $errors = concat $errors (include "qlm.validateModels" . | fromYamlArray) -}}
{{- $errors = concat $errors (include "qlm.validatePools" . | fromYamlArray) -}}
{{- $errors = concat $errors (include "qlm.validateAutoscaling" . | fromYamlArray) -}}
{{- $errors = concat $errors (include "qlm.validateWorkloads" . | fromYamlArray) -}}
{{- if $errors -}}
{{- fail (printf "\n\nqlm: the values are not valid:\n  - %s\n" (join "\n  - " $errors)) -}}
{{- end -}}
{{- end -}}

{{- define "qlm.validateRedis" -}}
{{- $errors := list -}}
{{- $redis := .Values.redis -}}
{{- if and $redis.enabled $redis.externalUrl -}}
{{- $errors = append $errors "redis.enabled and redis.externalUrl are both set: use the bundled Redis (redis.enabled=true, no externalUrl) or your own (redis.externalUrl, redis.enabled=false)" -}}
{{- else if and $redis.enabled $redis.sentinel.hosts -}}
{{- $errors = append $errors "redis.enabled and redis.sentinel.hosts are both set: the bundled Redis has no Sentinels; set redis.enabled=false to use yours" -}}
{{- else if and $redis.externalUrl $redis.sentinel.hosts -}}
{{- $errors = append $errors "redis.externalUrl and redis.sentinel.hosts are both set: give the Sentinels (the primary is theirs to name) or one URL, not both" -}}
{{- else if and (not $redis.enabled) (not $redis.externalUrl) (not $redis.sentinel.hosts) -}}
{{- $errors = append $errors "no Redis: set redis.enabled=true for the bundled Redis, or redis.enabled=false with redis.externalUrl=redis://HOST:6379/0 or redis.sentinel.hosts for yours" -}}
{{- end -}}
{{- if and $redis.enabled (gt (int $redis.replicasToAck) 0) -}}
{{- $errors = append $errors "redis.replicasToAck > 0 with the bundled Redis, which has no replica: every write would wait for a replica that never comes; use a replicated Redis (redis.sentinel) or 0" -}}
{{- end -}}
{{- if and $redis.sentinel.passwordKey (not $redis.externalAuth.existingSecret) -}}
{{- $errors = append $errors "redis.sentinel.passwordKey names a key of redis.externalAuth.existingSecret, which is not set" -}}
{{- end -}}
{{- if $redis.externalUrl -}}
{{- $url := urlParse $redis.externalUrl -}}
{{- if not (has $url.scheme (list "redis" "rediss")) -}}
{{- $errors = append $errors (printf "redis.externalUrl %q: the scheme must be redis:// or rediss:// (TLS)" $redis.externalUrl) -}}
{{- else if not $url.host -}}
{{- $errors = append $errors (printf "redis.externalUrl %q has no host (redis://HOST:PORT/DB)" $redis.externalUrl) -}}
{{- end -}}
{{- if $url.userinfo -}}
{{- $errors = append $errors "redis.externalUrl must not carry credentials: put the password in a Secret and name it in redis.externalAuth.existingSecret (and passwordKey)" -}}
{{- end -}}
{{- if and $url.path (not (regexMatch "^/[0-9]+$" $url.path)) -}}
{{- $errors = append $errors (printf "redis.externalUrl %q: the path must be a database number, e.g. /0" $redis.externalUrl) -}}
{{- end -}}
{{- if $url.query -}}
{{- $errors = append $errors (printf "redis.externalUrl %q: query options are not supported; give scheme, host, port and database only" $redis.externalUrl) -}}
{{- end -}}
{{- end -}}
{{- if and $redis.enabled $redis.externalAuth.existingSecret -}}
{{- $errors = append $errors "redis.externalAuth.existingSecret is set but Redis is bundled (redis.enabled=true): for the bundled Redis name your Secret in redis.auth.existingSecret" -}}
{{- end -}}
{{- if and $redis.externalAuth.existingSecret (not $redis.externalAuth.passwordKey) -}}
{{- $errors = append $errors "redis.externalAuth.passwordKey is empty: name the key of the password in the Secret redis.externalAuth.existingSecret" -}}
{{- end -}}
{{- if and $redis.enabled $redis.auth.existingSecret $redis.auth.password -}}
{{- $errors = append $errors "redis.auth.password and redis.auth.existingSecret are both set: give the password in your Secret or to the chart, not both" -}}
{{- end -}}
{{- if and $redis.enabled $redis.auth.existingSecret (not $redis.auth.existingSecretPasswordKey) -}}
{{- $errors = append $errors "redis.auth.existingSecretPasswordKey is empty: name the key of the password in the Secret redis.auth.existingSecret" -}}
{{- end -}}
{{- if and $redis.auth.password (not (regexMatch "^[A-Za-z0-9._~-]+$" $redis.auth.password)) -}}
{{- $errors = append $errors "redis.auth.password may only contain letters, digits and . _ ~ - (it goes into the queue URL)" -}}
{{- end -}}
{{- toYaml $errors -}}
{{- end -}}

{{- define "qlm.validateModels" -}}
{{- $errors := list -}}
{{- $names := list -}}
{{- if not .Values.models -}}
{{- $errors = append $errors "models is empty: list every model the fleet serves (name, maxContextTokens, path or repo)" -}}
{{- end -}}
{{- range $i, $model := .Values.models -}}
{{- if has $model.name $names -}}
{{- $errors = append $errors (printf "models[%d]: the name %q appears twice" $i $model.name) -}}
{{- end -}}
{{- $names = append $names $model.name -}}
{{- if and $model.path $model.repo -}}
{{- $errors = append $errors (printf "models[%d] (%s): path and repo are both set; give the weights folder (path) or a Hugging Face repo id in the cache (repo), not both" $i $model.name) -}}
{{- else if and (not $model.path) (not $model.repo) -}}
{{- $errors = append $errors (printf "models[%d] (%s): neither path nor repo is set; say where vLLM finds the weights" $i $model.name) -}}
{{- end -}}
{{- if lt (int $model.maxContextTokens) 16 -}}
{{- $errors = append $errors (printf "models[%d] (%s): maxContextTokens must be at least 16 (got %v)" $i $model.name $model.maxContextTokens) -}}
{{- end -}}
{{- $served := false -}}
{{- range $.Values.pools -}}{{- if has $model.name (default (list) .models) -}}{{- $served = true -}}{{- end -}}{{- end -}}
{{- if not $served -}}
{{- $errors = append $errors (printf "models[%d] (%s) is in no pool: add it to the models of a pool that may serve it, or remove it" $i $model.name) -}}
{{- end -}}
{{- end -}}
{{- toYaml $errors -}}
{{- end -}}

{{- define "qlm.validatePools" -}}
{{- $errors := list -}}
{{- $modelNames := list -}}
{{- range .Values.models -}}{{- $modelNames = append $modelNames .name -}}{{- end -}}
{{- $gpuTypes := concat (include "qlm.builtinGpuTypes" . | fromYamlArray) (keys .Values.fleet.gpuMemoryGiB) -}}
{{- $poolNames := list -}}
{{- $modelsByGpu := dict -}}
{{- if not .Values.pools -}}
{{- $errors = append $errors "pools is empty: add at least one engine pool (name, gpuType, gpusPerInstance, replicas, models)" -}}
{{- end -}}
{{- range $i, $pool := .Values.pools -}}
{{- $where := printf "pools[%d] (%s)" $i (default "?" $pool.name) -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (default "" $pool.name)) -}}
{{- $errors = append $errors (printf "%s: name must be a DNS label (lower-case letters, digits, '-')" $where) -}}
{{- else if gt (len (include "qlm.poolName" (list $ $pool))) 52 -}}
{{- $errors = append $errors (printf "%s: the StatefulSet name %q is longer than 52 characters; shorten the pool name or fullnameOverride" $where (include "qlm.poolName" (list $ $pool))) -}}
{{- end -}}
{{- if has $pool.name $poolNames -}}
{{- $errors = append $errors (printf "%s: the name appears twice" $where) -}}
{{- end -}}
{{- $poolNames = append $poolNames $pool.name -}}
{{- if not (has $pool.gpuType $gpuTypes) -}}
{{- $errors = append $errors (printf "%s: gpuType %q is unknown; known: %s (add others under fleet.gpuMemoryGiB)" $where (toString $pool.gpuType) (join ", " $gpuTypes)) -}}
{{- end -}}
{{- if lt (int $pool.gpusPerInstance) 1 -}}
{{- $errors = append $errors (printf "%s: gpusPerInstance must be at least 1 (got %v)" $where $pool.gpusPerInstance) -}}
{{- end -}}
{{- $scaling := include "qlm.poolAutoscaling" $pool | fromYaml -}}
{{- if and (not $scaling.enabled) (lt (int $pool.replicas) 1) -}}
{{- $errors = append $errors (printf "%s: replicas must be at least 1 (got %v); remove the pool instead" $where $pool.replicas) -}}
{{- end -}}
{{- if not $pool.models -}}
{{- $errors = append $errors (printf "%s: models is empty; list the models this pool may serve" $where) -}}
{{- end -}}
{{- range $model := (default (list) $pool.models) -}}
{{- if not (has $model $modelNames) -}}
{{- $errors = append $errors (printf "%s: model %q is not in models (known: %s)" $where $model (join ", " $modelNames)) -}}
{{- end -}}
{{- end -}}
{{- if and $pool.initialModel (not (has $pool.initialModel (default (list) $pool.models))) -}}
{{- $errors = append $errors (printf "%s: initialModel %q is not one of the pool's models" $where $pool.initialModel) -}}
{{- end -}}
{{- $resources := default (dict) $pool.resources -}}
{{- if or (hasKey (default (dict) $resources.requests) "nvidia.com/gpu") (hasKey (default (dict) $resources.limits) "nvidia.com/gpu") -}}
{{- $errors = append $errors (printf "%s: resources must not set nvidia.com/gpu; the chart sets it from gpusPerInstance" $where) -}}
{{- end -}}
{{- $key := toString $pool.gpuType -}}
{{- $sorted := sortAlpha (default (list) $pool.models) | join "," -}}
{{- if and (hasKey $modelsByGpu $key) (ne (get $modelsByGpu $key) $sorted) -}}
{{- $errors = append $errors (printf "%s: another pool of gpuType %s lists other models; QLM plans by GPU type (profiles are per model and GPU type), so pools of one GPU type must list the same models" $where $key) -}}
{{- end -}}
{{- $_ := set $modelsByGpu $key $sorted -}}
{{- $cache := include "qlm.poolModelCache" (list $ $pool) | fromYaml -}}
{{- if not (has $cache.type (list "pvc" "existingClaim" "hostPath" "emptyDir")) -}}
{{- $errors = append $errors (printf "%s: modelCache.type %q is unknown; use pvc, existingClaim, hostPath or emptyDir" $where (toString $cache.type)) -}}
{{- else if and (eq $cache.type "existingClaim") (not $cache.existingClaim) -}}
{{- $errors = append $errors (printf "%s: modelCache.type is existingClaim but modelCache.existingClaim (the claim's name) is empty" $where) -}}
{{- else if and (eq $cache.type "hostPath") (not $cache.hostPath) -}}
{{- $errors = append $errors (printf "%s: modelCache.type is hostPath but modelCache.hostPath (the node folder) is empty" $where) -}}
{{- else if and (eq $cache.type "pvc") (not $cache.size) -}}
{{- $errors = append $errors (printf "%s: modelCache.type is pvc but modelCache.size is empty" $where) -}}
{{- end -}}
{{- if not (hasPrefix "/" (toString $cache.mountPath)) -}}
{{- $errors = append $errors (printf "%s: modelCache.mountPath %q must be an absolute path" $where (toString $cache.mountPath)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $errors -}}
{{- end -}}

{{/*
Pool autoscaling (pools[].autoscaling): the range, the mode, and what the mode needs. The
controller with controller.kubernetes_scaling sets the scale of every qlm.autoscale pool
(qlm/autoscale/kubernetes.py), so the two modes cannot be mixed in one release.
*/}}
{{- define "qlm.validateAutoscaling" -}}
{{- $errors := list -}}
{{- $modes := dict -}}
{{- range $i, $pool := .Values.pools -}}
{{- $scaling := include "qlm.poolAutoscaling" $pool | fromYaml -}}
{{- if $scaling.enabled -}}
{{- $where := printf "pools[%d] (%s)" $i (default "?" $pool.name) -}}
{{- $min := int $scaling.minReplicas -}}
{{- $max := int $scaling.maxReplicas -}}
{{- if lt $max 1 -}}
{{- $errors = append $errors (printf "%s: autoscaling.maxReplicas must be at least 1 (got %v)" $where $scaling.maxReplicas) -}}
{{- end -}}
{{- if gt $min $max -}}
{{- $errors = append $errors (printf "%s: autoscaling.minReplicas (%v) is above maxReplicas (%v)" $where $scaling.minReplicas $scaling.maxReplicas) -}}
{{- end -}}
{{- if eq $scaling.via "hpa" -}}
{{- if lt $min 1 -}}
{{- $errors = append $errors (printf "%s: autoscaling.minReplicas must be at least 1 with via hpa (got %v); a HorizontalPodAutoscaler does not scale to zero, via controller does" $where $scaling.minReplicas) -}}
{{- end -}}
{{- else if eq $scaling.via "controller" -}}
{{- if lt $min 0 -}}
{{- $errors = append $errors (printf "%s: autoscaling.minReplicas must be at least 0 (got %v)" $where $scaling.minReplicas) -}}
{{- end -}}
{{- if not (and $.Values.rbac.create $.Values.rbac.allowScaling) -}}
{{- $errors = append $errors (printf "%s: autoscaling.via controller needs rbac.create=true and rbac.allowScaling=true: the QLM controller sets the StatefulSet's scale through the Kubernetes API" $where) -}}
{{- end -}}
{{- else -}}
{{- $errors = append $errors (printf "%s: autoscaling.via %q is unknown; use hpa (a HorizontalPodAutoscaler on qlm_pool_desired_replicas) or controller (the QLM controller sets the StatefulSet's scale)" $where (toString $scaling.via)) -}}
{{- end -}}
{{- $_ := set $modes (toString $scaling.via) (append (get $modes (toString $scaling.via) | default (list)) $pool.name) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $modes "hpa") (hasKey $modes "controller") -}}
{{- $errors = append $errors (printf "pools: autoscaling.via is hpa for %s but controller for %s; use one mode for every autoscaled pool (the controller, with controller.kubernetes_scaling, sets the scale of every autoscaled pool)" (join ", " (get $modes "hpa")) (join ", " (get $modes "controller"))) -}}
{{- end -}}
{{- if hasKey (default (dict) (default (dict) .Values.qlm).autoscale) "pools" -}}
{{- $errors = append $errors "qlm.autoscale.pools is set by the chart from pools[].autoscaling: remove it and turn on autoscaling per pool (qlm.autoscale's other settings, e.g. target_utilization, are kept)" -}}
{{- end -}}
{{- toYaml $errors -}}
{{- end -}}

{{- define "qlm.validateWorkloads" -}}
{{- $errors := list -}}
{{- $scaling := .Values.api.autoscaling -}}
{{- if $scaling.enabled -}}
{{- if lt (int $scaling.minReplicas) 1 -}}
{{- $errors = append $errors "api.autoscaling.minReplicas must be at least 1" -}}
{{- end -}}
{{- if lt (int $scaling.maxReplicas) (int $scaling.minReplicas) -}}
{{- $errors = append $errors (printf "api.autoscaling.maxReplicas (%v) is below minReplicas (%v)" $scaling.maxReplicas $scaling.minReplicas) -}}
{{- end -}}
{{- else if lt (int .Values.api.replicas) 1 -}}
{{- $errors = append $errors "api.replicas must be at least 1" -}}
{{- end -}}
{{- if lt (int .Values.controller.replicas) 1 -}}
{{- $errors = append $errors "controller.replicas must be at least 1 (a second one takes over when the leader stops)" -}}
{{- end -}}
{{- range $key := list "host" "port" -}}
{{- if hasKey $.Values.metrics.settings $key -}}
{{- $errors = append $errors (printf "metrics.settings.%s is set by the chart; use metrics.port" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.rbac.create (not .Values.serviceAccount.create) -}}
{{- $errors = append $errors "rbac.create needs serviceAccount.create: the Role is bound to the controller's own service account" -}}
{{- end -}}
{{- if and .Values.rbac.allowScaling (not .Values.rbac.create) -}}
{{- $errors = append $errors "rbac.allowScaling needs rbac.create=true" -}}
{{- end -}}
{{- toYaml $errors -}}
{{- end -}}
