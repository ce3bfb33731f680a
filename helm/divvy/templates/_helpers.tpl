{{/* The chart's name. */}}
{{- define "divvy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A fully qualified app name. */}}
{{- define "divvy.fullname" -}}
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

{{/* Common labels. */}}
{{- define "divvy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "divvy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels. */}}
{{- define "divvy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "divvy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount name. */}}
{{- define "divvy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "divvy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the rules. */}}
{{- define "divvy.configMapName" -}}
{{- default (include "divvy.fullname" .) .Values.existingConfigMap }}
{{- end }}

{{/* The image: repository@digest, or repository:tag (default appVersion). */}}
{{- define "divvy.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The config's syntax: configFormat, else configFileName's extension, else yaml. */}}
{{- define "divvy.configFormat" -}}
{{- $name := .Values.configFileName }}
{{- if .Values.configFormat }}
{{- .Values.configFormat }}
{{- else if or (hasSuffix ".yaml" $name) (hasSuffix ".yml" $name) }}yaml
{{- else if hasSuffix ".json" $name }}json
{{- else if hasSuffix ".ini" $name }}ini
{{- else if $name }}
{{- fail (printf "configFileName %q: the extension must be .yaml, .yml, .json or .ini (or set configFormat)" $name) }}
{{- else }}yaml
{{- end }}
{{- end }}

{{/* The rules' file name in the ConfigMap; its extension agrees with the format. */}}
{{- define "divvy.configFileName" -}}
{{- $format := include "divvy.configFormat" . }}
{{- $name := .Values.configFileName }}
{{- $yaml := or (eq $format "yaml") (eq $format "ratelimit") }}
{{- if not $name }}
{{- get (dict "yaml" "divvy.yaml" "json" "divvy.json" "ini" "divvy.ini" "ratelimit" "ratelimit.yaml") $format }}
{{- else if and $yaml (not (or (hasSuffix ".yaml" $name) (hasSuffix ".yml" $name))) }}
{{- fail (printf "configFileName %q must end in .yaml or .yml for configFormat %s" $name $format) }}
{{- else if and (eq $format "json") (not (hasSuffix ".json" $name)) }}
{{- fail (printf "configFileName %q must end in .json for configFormat json" $name) }}
{{- else if and (eq $format "ini") (not (hasSuffix ".ini" $name)) }}
{{- fail (printf "configFileName %q must end in .ini for configFormat ini" $name) }}
{{- else }}
{{- $name }}
{{- end }}
{{- end }}

{{/* Where the pods mount the rules. */}}
{{- define "divvy.configDir" -}}/etc/divvy{{- end }}

{{/* What --config names: the rules file, or for envoyproxy/ratelimit files
the directory (divvy reads those from every *.yaml of a config directory). */}}
{{- define "divvy.configPath" -}}
{{- if eq (include "divvy.configFormat" .) "ratelimit" }}
{{- include "divvy.configDir" . }}
{{- else }}
{{- printf "%s/%s" (include "divvy.configDir" .) (include "divvy.configFileName" .) }}
{{- end }}
{{- end }}

{{/* The example rules used when config is empty, as a map. */}}
{{- define "divvy.defaultRules" -}}
overrides:
  - label: per-client
    domain: edge
    operation: {remote_address: "*"}
    creditLimit: 600
    resetSeconds: 1m
    actorField: remote_address
default:
  creditLimit: 1
  resetSeconds: 0
{{- end }}

{{/* The same example in divvy's INI form. */}}
{{- define "divvy.defaultRulesIni" -}}
[remote_address=*]
label = per-client
domain = edge
creditLimit = 600
resetSeconds = 60
actorField = remote_address

[default]
creditLimit = 1
resetSeconds = 0
{{ end }}

{{/* The same example as an envoyproxy/ratelimit file. */}}
{{- define "divvy.defaultRulesRatelimit" -}}
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 600
{{- end }}

{{/* Fails unless a parsed config (fromYaml / fromJson) is a map of the format's kind. */}}
{{- define "divvy.checkParsed" -}}
{{- $parsed := index . 0 }}
{{- $format := index . 1 }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "config is not a %s map: %s" $format (get $parsed "Error")) }}
{{- end }}
{{- if and (eq $format "ratelimit") (not (hasKey $parsed "domain")) }}
{{- fail "config: an envoyproxy/ratelimit file (configFormat ratelimit) needs a top-level domain" }}
{{- end }}
{{- if and (ne $format "ratelimit") (hasKey $parsed "domain") (hasKey $parsed "descriptors") }}
{{- fail (printf "config looks like an envoyproxy/ratelimit file (domain, descriptors): set configFormat ratelimit, not %s" $format) }}
{{- end }}
{{- end }}

{{/* The rules file's content in the chosen syntax: the example when config
is empty, a string verbatim, a map rendered; anything else refused. */}}
{{- define "divvy.configText" -}}
{{- $format := include "divvy.configFormat" . }}
{{- $config := .Values.config }}
{{- if empty $config }}
{{- if eq $format "ini" }}
{{- include "divvy.defaultRulesIni" . }}
{{- else if eq $format "ratelimit" }}
{{- include "divvy.defaultRulesRatelimit" . }}
{{- else if eq $format "json" }}
{{- include "divvy.defaultRules" . | fromYaml | toPrettyJson }}
{{- else }}
{{- include "divvy.defaultRules" . }}
{{- end }}
{{- else if kindIs "string" $config }}
{{- if eq $format "json" }}
{{- include "divvy.checkParsed" (list (fromJson $config) $format) }}
{{- else if ne $format "ini" }}
{{- include "divvy.checkParsed" (list (fromYaml $config) $format) }}
{{- else if not (regexMatch "(?m)^\\s*\\[[^\\]]+\\]\\s*$" $config) }}
{{- fail "config (configFormat ini) has no [section]: divvy's INI form is [key=value ...] sections and [default]" }}
{{- end }}
{{- $config }}
{{- else if kindIs "map" $config }}
{{- if eq $format "ini" }}
{{- fail "config is a map but configFormat is ini: give the INI text as a string (config: |)" }}
{{- end }}
{{- include "divvy.checkParsed" (list $config $format) }}
{{- if eq $format "json" }}
{{- toPrettyJson $config }}
{{- else }}
{{- toYaml $config }}
{{- end }}
{{- else }}
{{- fail (printf "config must be a map or a string of %s, not a %s" $format (kindOf $config)) }}
{{- end }}
{{- end }}

{{/* A NetworkPolicy peer from namespaceSelector / podSelector values (null leaves one out). */}}
{{- define "divvy.peer" -}}
{{- $peer := dict }}
{{- if not (kindIs "invalid" .namespaceSelector) }}
{{- $_ := set $peer "namespaceSelector" .namespaceSelector }}
{{- end }}
{{- if not (kindIs "invalid" .podSelector) }}
{{- $_ := set $peer "podSelector" .podSelector }}
{{- end }}
{{- if not $peer }}
{{- fail "networkPolicy: a peer needs a namespaceSelector or a podSelector (null on both would admit nothing)" }}
{{- end }}
{{- toYaml (list $peer) }}
{{- end }}
