{{/* Names and labels, namespaced under "agenttx." (cert-manager style). */}}

{{- define "agenttx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The resource-name prefix; also the service Deployment's name. */}}
{{- define "agenttx.fullname" -}}
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

{{- define "agenttx.operator.fullname" -}}
{{- printf "%s-operator" (include "agenttx.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "agenttx.etcd.fullname" -}}
{{- printf "%s-etcd" (include "agenttx.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "agenttx.etcd.headless" -}}
{{- printf "%s-peer" (include "agenttx.etcd.fullname" .) }}
{{- end }}

{{- define "agenttx.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; pass (dict "ctx" $ "component" "service"). */}}
{{- define "agenttx.labels" -}}
helm.sh/chart: {{ include "agenttx.chart" .ctx }}
{{ include "agenttx.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: agenttx
{{- end }}

{{- define "agenttx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agenttx.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "agenttx.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "agenttx.service.serviceAccountName" -}}
{{- if .Values.service.serviceAccount.create }}
{{- default (include "agenttx.fullname" .) .Values.service.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.service.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "agenttx.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "agenttx.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* etcd client endpoints, comma-separated. The bundled cluster is reached through its
client Service: one DNS name, load-balanced over the members. */}}
{{- define "agenttx.etcd.endpoints" -}}
{{- if .Values.etcd.enabled }}
{{- printf "%s.%s.svc:2379" (include "agenttx.etcd.fullname" .) .Release.Namespace }}
{{- else }}
{{- if not .Values.etcd.external.endpoints }}
{{- fail "etcd.enabled is false: set etcd.external.endpoints (host:port list)" }}
{{- end }}
{{- join "," .Values.etcd.external.endpoints }}
{{- end }}
{{- end }}

{{- define "agenttx.etcd.tlsEnabled" -}}
{{- if and (not .Values.etcd.enabled) .Values.etcd.external.tls.enabled }}true{{ end }}
{{- end }}

{{- define "agenttx.etcd.tlsDir" -}}/etc/agenttx/etcd-tls{{- end }}

{{/* TLS env vars; pass (dict "ctx" $ "prefix" "AGENTTX_"). */}}
{{- define "agenttx.etcd.tlsEnv" -}}
{{- if include "agenttx.etcd.tlsEnabled" .ctx }}
{{- $tls := .ctx.Values.etcd.external.tls }}
{{- $dir := include "agenttx.etcd.tlsDir" .ctx }}
- name: {{ .prefix }}ETCD_CA_FILE
  value: {{ printf "%s/%s" $dir $tls.caKey | quote }}
{{- if and $tls.certKey $tls.keyKey }}
- name: {{ .prefix }}ETCD_CERT_FILE
  value: {{ printf "%s/%s" $dir $tls.certKey | quote }}
- name: {{ .prefix }}ETCD_KEY_FILE
  value: {{ printf "%s/%s" $dir $tls.keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "agenttx.etcd.tlsVolume" -}}
{{- if include "agenttx.etcd.tlsEnabled" . }}
{{- if not .Values.etcd.external.tls.secretName }}
{{- fail "etcd.external.tls.enabled: set etcd.external.tls.secretName" }}
{{- end }}
- name: etcd-tls
  secret:
    secretName: {{ .Values.etcd.external.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "agenttx.etcd.tlsMount" -}}
{{- if include "agenttx.etcd.tlsEnabled" . }}
- name: etcd-tls
  mountPath: {{ include "agenttx.etcd.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}
