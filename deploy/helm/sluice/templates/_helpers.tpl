{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.fullname" -}}
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

{{/* fullname + "-" + suffix, still a valid 63-character DNS label. */}}
{{- define "sluice.suffixed" -}}
{{- printf "%s-%s" (include "sluice.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix }}
{{- end }}

{{- define "sluice.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "sluice.imageTag" .) }}
{{- end }}
{{- end }}

{{/* Labels: call with (dict "root" $ "component" "gateway"). ------------------------------ */}}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ include "sluice.chart" .root }}
{{ include "sluice.selectorLabels" .root }}
app.kubernetes.io/version: {{ regexReplaceAll "[^A-Za-z0-9._-]" (include "sluice.imageTag" .root) "_" | trunc 63 | trimSuffix "_" | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/component: {{ .component }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The effective Sluice config (YAML). ----------------------------------------------------
The user's values.config replaces the default whole; the default (files/default-config.yaml)
is used only when values.config is empty. With persistence, state_dir defaults to its mount. */}}
{{- define "sluice.config" -}}
{{- $cfg := dict }}
{{- if .Values.config }}
{{- $cfg = deepCopy .Values.config }}
{{- else }}
{{- $cfg = .Files.Get "files/default-config.yaml" | fromYaml }}
{{- end }}
{{- if and .Values.persistence.enabled (not (hasKey $cfg "state_dir")) }}
{{- $_ := set $cfg "state_dir" .Values.persistence.mountPath }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* A duration as humantime writes it (30s, 1m 30s, 250ms) → whole seconds, rounded up; empty
when it cannot be read. */}}
{{- define "sluice.durationSeconds" -}}
{{- $s := regexReplaceAll "\\s+" (toString .) "" }}
{{- $ms := 0 }}
{{- $ok := regexMatch "^([0-9]+[a-zA-Z]+)+$" $s }}
{{- range regexFindAll "[0-9]+[a-zA-Z]+" $s -1 }}
{{- $n := regexFind "^[0-9]+" . | atoi }}
{{- $u := regexReplaceAll "^[0-9]+" . "" }}
{{- if has $u (list "ms" "msec" "msecs") }}{{ $ms = add $ms $n }}
{{- else if has $u (list "s" "sec" "secs" "second" "seconds") }}{{ $ms = add $ms (mul $n 1000) }}
{{- else if has $u (list "m" "min" "mins" "minute" "minutes") }}{{ $ms = add $ms (mul $n 60000) }}
{{- else if has $u (list "h" "hr" "hrs" "hour" "hours") }}{{ $ms = add $ms (mul $n 3600000) }}
{{- else }}{{ $ok = false }}
{{- end }}
{{- end }}
{{- if $ok }}{{ div (add $ms 999) 1000 }}{{ end }}
{{- end }}

{{/* A byte size as the daemon reads it (256MiB, 1 GiB, 512KB, 1048576) → MiB, rounded up;
empty when it cannot be read. */}}
{{- define "sluice.sizeMiB" -}}
{{- $bytes := -1 }}
{{- if kindIs "string" . }}
{{- $s := regexReplaceAll "\\s+" . "" | lower }}
{{- if regexMatch "^[0-9]+[a-z]*$" $s }}
{{- $n := regexFind "^[0-9]+" $s | atoi }}
{{- $u := regexReplaceAll "^[0-9]+" $s "" }}
{{- $f := dict "" 1 "b" 1 "k" 1000 "kb" 1000 "ki" 1024 "kib" 1024 "m" 1000000 "mb" 1000000 "mi" 1048576 "mib" 1048576 "g" 1000000000 "gb" 1000000000 "gi" 1073741824 "gib" 1073741824 }}
{{- if hasKey $f $u }}{{ $bytes = mul $n (get $f $u) }}{{ end }}
{{- end }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- $bytes = int64 . }}
{{- end }}
{{- if ge (int64 $bytes) 0 }}{{ div (add $bytes 1048575) 1048576 }}{{ end }}
{{- end }}

{{/* What the chart derives from the config, as JSON: admin address, webhook ports and paths,
shutdown_grace and memory_budget. */}}
{{- define "sluice.model" -}}
{{- $cfg := include "sluice.config" . | fromYaml }}
{{- $admin := $cfg.admin | default dict }}
{{- $adminEnabled := true }}
{{- if hasKey $admin "enabled" }}{{ $adminEnabled = $admin.enabled }}{{ end }}
{{- $adminListen := toString (default "127.0.0.1:7777" $admin.listen) }}
{{- $adminPort := regexFind "[0-9]+$" $adminListen }}
{{- $adminHost := trimSuffix (printf ":%s" $adminPort) $adminListen }}
{{- $ports := dict }}
{{- $hooks := list }}
{{- /* Kinds that listen for HTTP, with their default path; all default to 0.0.0.0:12000
       but sns (its own listener, 0.0.0.0:12001). */ -}}
{{- $listeners := dict "webhook" "/" "github" "/github" "gitlab" "/gitlab" "bitbucket" "/bitbucket" "bitbucket-server" "/bitbucket-server" "gerrit" "/gerrit" "stripe" "/stripe" "slack" "/slack" "standard-webhooks" "/webhooks" "hmac" "/hmac" "sns" "/sns" }}
{{- range $name, $src := ($cfg.sources | default dict) }}
{{- $kind := toString $src.kind }}
{{- if hasKey $listeners $kind }}
{{- $listen := toString (default (ternary "0.0.0.0:12001" "0.0.0.0:12000" (eq $kind "sns")) $src.listen) }}
{{- $port := regexFind "[0-9]+$" $listen }}
{{- if not $port }}
{{- fail (printf "config.sources.%s.listen is %q: the chart derives the container port from it and needs a literal host:port" $name $listen) }}
{{- end }}
{{- $host := trimSuffix (printf ":%s" $port) $listen }}
{{- $loopback := or (hasPrefix "127." $host) (eq $host "[::1]") (eq $host "localhost") }}
{{- if not $loopback }}
{{- $_ := set $ports $port true }}
{{- $hooks = append $hooks (dict "name" $name "path" (toString (default (get $listeners $kind) $src.path)) "port" $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- $portList := list }}
{{- $many := gt (len $ports) 1 }}
{{- range $p := keys $ports | sortAlpha }}
{{- $portList = append $portList (dict "port" $p "name" (ternary (printf "webhook-%s" $p) "webhook" $many)) }}
{{- end }}
{{- $grace := include "sluice.durationSeconds" (default "30s" $cfg.shutdown_grace) }}
{{- $budget := include "sluice.sizeMiB" (default "256MiB" ($cfg.pipeline | default dict).memory_budget) }}
{{- dict "adminEnabled" $adminEnabled "adminListen" $adminListen "adminListenSet" (hasKey $admin "listen") "adminHost" $adminHost "adminPort" $adminPort "adminLoopback" (or (hasPrefix "127." $adminHost) (eq $adminHost "[::1]") (eq $adminHost "localhost")) "webhookPorts" $portList "webhooks" $hooks "graceSeconds" $grace "budgetMiB" $budget "stateDir" (toString (default "" $cfg.state_dir)) | toJson }}
{{- end }}

{{/* Checks that stop a render which could not work; included by the workload template. */}}
{{- define "sluice.validate" -}}
{{- $m := include "sluice.model" . | fromJson }}
{{- if and .Values.probes.enabled (not $m.adminEnabled) }}
{{- fail "probes.enabled is true but config.admin.enabled is false: /healthz and /readyz are served by the admin server. Enable it (admin: {listen: 0.0.0.0:7777}) or set probes.enabled=false." }}
{{- end }}
{{- if and $m.adminEnabled (not $m.adminPort) }}
{{- fail (printf "config.admin.listen is %q: the chart derives the admin port from it and needs a literal host:port" $m.adminListen) }}
{{- end }}
{{- if and .Values.probes.enabled $m.adminLoopback }}
{{- fail (printf "config.admin.listen is %s%s: the kubelet probes the pod IP and cannot reach a loopback address, so the pod would never become Ready. Set config.admin.listen to 0.0.0.0:%s, or probes.enabled=false." $m.adminListen (ternary "" " (the daemon's default when admin.listen is not set)" $m.adminListenSet) $m.adminPort) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (or (not $m.adminEnabled) $m.adminLoopback) }}
{{- fail (printf "metrics.serviceMonitor.enabled needs the admin server on a non-loopback address; config.admin.listen is %s (enabled: %v)" $m.adminListen $m.adminEnabled) }}
{{- end }}
{{- range $m.webhookPorts }}
{{- if and $m.adminEnabled (eq .port $m.adminPort) }}
{{- fail (printf "config.admin.listen and a webhook source both use port %s" .port) }}
{{- end }}
{{- end }}
{{- if .Values.persistence.enabled }}
{{- if ne $m.stateDir .Values.persistence.mountPath }}
{{- fail (printf "config.state_dir is %q but the persistent volume is mounted at persistence.mountPath %q: make them equal (or leave state_dir out, the chart sets it)" $m.stateDir .Values.persistence.mountPath) }}
{{- end }}
{{- else if $m.stateDir }}
{{- $mounted := false }}
{{- range .Values.extraVolumeMounts }}{{ if eq .mountPath $m.stateDir }}{{ $mounted = true }}{{ end }}{{ end }}
{{- if not $mounted }}
{{- fail (printf "config.state_dir is %q but persistence.enabled is false and no extraVolumeMounts entry is mounted there (the root filesystem is read-only): set persistence.enabled=true (a StatefulSet, one volume per replica) or remove state_dir" $m.stateDir) }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- if and $m.graceSeconds (le (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) (int $m.graceSeconds))) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be larger than preStopSleepSeconds (%v) + config.shutdown_grace (%vs), or the kubelet kills the daemon while it drains" .Values.terminationGracePeriodSeconds .Values.preStopSleepSeconds $m.graceSeconds) }}
{{- end }}
{{- else if not $m.graceSeconds }}
{{- fail "config.shutdown_grace could not be read by the chart: set terminationGracePeriodSeconds explicitly (above preStopSleepSeconds + shutdown_grace)" }}
{{- end }}
{{- if and .Values.sidecar.enabled (not .Values.sidecar.containers) }}
{{- fail "sidecar.enabled is true but sidecar.containers is empty: give the app's containers" }}
{{- end }}
{{- if and .Values.ingress.enabled (not $m.webhookPorts) }}
{{- fail "ingress.enabled is true but no webhook source listens on a non-loopback address" }}
{{- end }}
{{- if and (not (hasKey .Values.resources.requests "memory")) (not $m.budgetMiB) }}
{{- fail "config.pipeline.memory_budget could not be read by the chart: set resources.requests.memory and resources.limits.memory explicitly" }}
{{- end }}
{{- end }}

{{/* resources with the derived memory request and limit. */}}
{{- define "sluice.resources" -}}
{{- $m := include "sluice.model" . | fromJson }}
{{- $r := deepCopy (.Values.resources | default dict) }}
{{- $req := $r.requests | default dict }}
{{- $lim := $r.limits | default dict }}
{{- $reqMiB := add (int $m.budgetMiB) (int .Values.memoryOverheadMiB) }}
{{- if not (hasKey $req "memory") }}{{ $_ := set $req "memory" (printf "%dMi" $reqMiB) }}{{ end }}
{{- if not (hasKey $lim "memory") }}{{ $_ := set $lim "memory" (printf "%dMi" (mul 2 $reqMiB)) }}{{ end }}
{{- $_ := set $r "requests" $req }}
{{- $_ := set $r "limits" $lim }}
{{- toYaml $r }}
{{- end }}

{{- define "sluice.terminationGracePeriodSeconds" -}}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- $m := include "sluice.model" . | fromJson }}
{{- add (int .Values.preStopSleepSeconds) (int $m.graceSeconds) 15 }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* The Sluice container; `restartPolicy: Always` is added for the native sidecar. */}}
{{- define "sluice.container" -}}
{{- $m := include "sluice.model" . | fromJson -}}
- name: sluice
  image: {{ include "sluice.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if .Values.sidecar.enabled }}
  restartPolicy: Always
  {{- end }}
  args: {{ toJson .Values.args }}
  {{- if or $m.webhookPorts $m.adminEnabled }}
  ports:
    {{- range $m.webhookPorts }}
    - { name: {{ .name }}, containerPort: {{ .port }}, protocol: TCP }
    {{- end }}
    {{- if $m.adminEnabled }}
    - { name: admin, containerPort: {{ $m.adminPort }}, protocol: TCP }
    {{- end }}
  {{- end }}
  env:
    {{- $threads := true }}
    {{- range .Values.env }}{{ if eq .name "SLUICE_THREADS" }}{{ $threads = false }}{{ end }}{{ end }}
    {{- if $threads }}
    # Worker threads = the CPU limit, rounded up.
    - name: SLUICE_THREADS
      valueFrom:
        resourceFieldRef: { resource: limits.cpu, divisor: "1" }
    {{- end }}
    {{- with .Values.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.envFrom }}
  envFrom:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.probes.enabled }}
  livenessProbe:
    httpGet: { path: /healthz, port: admin }
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet: { path: /readyz, port: admin }
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  {{- end }}
  {{- if gt (int .Values.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      sleep: { seconds: {{ int .Values.preStopSleepSeconds }} }
  {{- end }}
  resources:
    {{- include "sluice.resources" . | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - { name: config, mountPath: /etc/sluice/sluice.yaml, subPath: sluice.yaml, readOnly: true }
    - { name: tmp, mountPath: /tmp }
    {{- if .Values.persistence.enabled }}
    - { name: state, mountPath: {{ .Values.persistence.mountPath }} }
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/* The pod template of the Deployment or StatefulSet. */}}
{{- define "sluice.podTemplate" -}}
metadata:
  labels:
    {{- include "sluice.labels" (dict "root" . "component" "gateway") | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "sluice.config" . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "sluice.serviceAccountName" . }}
  # The token only when the chart grants Kubernetes permissions (rbac.rules).
  automountServiceAccountToken: {{ if .Values.rbac.rules }}true{{ else }}false{{ end }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ include "sluice.terminationGracePeriodSeconds" . }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if .Values.sidecar.enabled }}
  # Native sidecar: started (and Ready) before the app's containers, stopped after they exit,
  # so the app's last webhooks during its shutdown are still accepted.
  initContainers:
    {{- include "sluice.container" . | nindent 4 }}
  containers:
    {{- toYaml .Values.sidecar.containers | nindent 4 }}
  {{- else }}
  containers:
    {{- include "sluice.container" . | nindent 4 }}
  {{- end }}
  volumes:
    - name: config
      configMap: { name: {{ include "sluice.fullname" . }} }
    - name: tmp
      emptyDir: { sizeLimit: 64Mi }
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.topologySpreadConstraints }}
  {{- $tsc := list }}
  {{- range .Values.topologySpreadConstraints }}
  {{- $c := deepCopy . }}
  {{- if not (hasKey $c "labelSelector") }}
  {{- $_ := set $c "labelSelector" (dict "matchLabels" (include "sluice.selectorLabels" $ | fromYaml)) }}
  {{- end }}
  {{- $tsc = append $tsc $c }}
  {{- end }}
  topologySpreadConstraints:
    {{- toYaml $tsc | nindent 4 }}
  {{- end }}
{{- end }}
