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

{{- define "agenttx.console.fullname" -}}
{{- printf "%s-console" (include "agenttx.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where the console finds the CA of the service's certificate (tls.*). */}}
{{- define "agenttx.console.serviceCADir" -}}/etc/agenttx/service-ca{{- end }}

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

{{/* Whether the service and operator talk TLS to etcd: the bundled cluster with
etcd.tls.enabled, or an external one with etcd.external.tls.enabled. */}}
{{- define "agenttx.etcd.tlsEnabled" -}}
{{- if .Values.etcd.enabled }}
{{- if .Values.etcd.tls.enabled }}true{{ end }}
{{- else if .Values.etcd.external.tls.enabled }}true{{ end }}
{{- end }}

{{/* Secrets of the bundled cluster: the members' certificate (server and peer) and
the client certificate of the service and operator. Both carry ca.crt. */}}
{{- define "agenttx.etcd.serverSecret" -}}
{{- printf "%s-tls" (include "agenttx.etcd.fullname" .) }}
{{- end }}

{{- define "agenttx.etcd.clientSecret" -}}
{{- printf "%s-client-tls" (include "agenttx.etcd.fullname" .) }}
{{- end }}

{{/* CommonNames: peers must present the members' one (--peer-cert-allowed-cn). */}}
{{- define "agenttx.etcd.memberCN" -}}
{{- include "agenttx.etcd.fullname" . }}
{{- end }}

{{- define "agenttx.etcd.clientCN" -}}
{{- printf "%s-client" (include "agenttx.etcd.fullname" .) }}
{{- end }}

{{/* DNS names of the members' certificate: the client Service and every member's
stable name behind the peer Service, short and fully qualified, plus localhost for
tools run inside a member pod. */}}
{{- define "agenttx.etcd.dnsNames" -}}
{{- $etcd := include "agenttx.etcd.fullname" . }}
{{- $peer := include "agenttx.etcd.headless" . }}
{{- $ns := .Release.Namespace }}
{{- $d := .Values.clusterDomain }}
{{- toYaml (list $etcd (printf "%s.%s" $etcd $ns) (printf "%s.%s.svc" $etcd $ns) (printf "%s.%s.svc.%s" $etcd $ns $d) (printf "*.%s.%s.svc" $peer $ns) (printf "*.%s.%s.svc.%s" $peer $ns $d) "localhost") }}
{{- end }}

{{- define "agenttx.etcd.tlsDir" -}}/etc/agenttx/etcd-tls{{- end }}

{{/* Where the members mount their own certificate. */}}
{{- define "agenttx.etcd.memberTlsDir" -}}/etc/etcd/tls{{- end }}

{{/* TLS env vars; pass (dict "ctx" $ "prefix" "AGENTTX_"). */}}
{{- define "agenttx.etcd.tlsEnv" -}}
{{- if include "agenttx.etcd.tlsEnabled" .ctx }}
{{- $dir := include "agenttx.etcd.tlsDir" .ctx }}
{{- $tls := dict "caKey" "ca.crt" "certKey" "tls.crt" "keyKey" "tls.key" }}
{{- if not .ctx.Values.etcd.enabled }}
{{- $tls = .ctx.Values.etcd.external.tls }}
{{- end }}
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

{{/* The etcd client Secret, mounted as a directory (rotated files show up in place). */}}
{{- define "agenttx.etcd.tlsVolume" -}}
{{- if include "agenttx.etcd.tlsEnabled" . }}
{{- $secret := include "agenttx.etcd.clientSecret" . }}
{{- if not .Values.etcd.enabled }}
{{- if not .Values.etcd.external.tls.secretName }}
{{- fail "etcd.external.tls.enabled: set etcd.external.tls.secretName" }}
{{- end }}
{{- $secret = .Values.etcd.external.tls.secretName }}
{{- end }}
- name: etcd-tls
  secret:
    secretName: {{ $secret }}
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

{{/* ---- client-facing TLS and authentication of the service ---------------------- */}}

{{- define "agenttx.tls.enabled" -}}
{{- if or .Values.tls.secretName .Values.tls.certManager.enabled }}true{{ end }}
{{- end }}

{{- define "agenttx.tls.secretName" -}}
{{- default (printf "%s-tls" (include "agenttx.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{- define "agenttx.tls.dir" -}}/etc/agenttx/tls{{- end }}

{{- define "agenttx.auth.dir" -}}/etc/agenttx/auth{{- end }}

{{- define "agenttx.probe.dir" -}}/etc/agenttx/probe{{- end }}

{{/* The Service's own DNS names (the service certificate always carries them). */}}
{{- define "agenttx.service.dnsNames" -}}
{{- $n := include "agenttx.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- toYaml (concat (list $n (printf "%s.%s" $n $ns) (printf "%s.%s.svc" $n $ns) (printf "%s.%s.svc.%s" $n $ns .Values.clusterDomain)) .Values.tls.certManager.dnsNames | uniq) }}
{{- end }}

{{/* Whether the operator publishes the issuer keys (and gets the RBAC to read them). */}}
{{- define "agenttx.operator.publishJwks" -}}
{{- if and .Values.operator.enabled .Values.operator.jwks.publish (eq .Values.auth.mode "kubernetes") }}true{{ end }}
{{- end }}

{{/* Settings that only make sense together; rendered by service-deployment.yaml, so a
bad combination fails `helm install` with a message instead of a crash-looping pod. */}}
{{- define "agenttx.validate" -}}
{{- $mode := .Values.auth.mode }}
{{- if and (eq $mode "none") (not .Values.auth.allowUnauthenticated) }}
{{- fail "auth.mode none: the service listens on 0.0.0.0, so anyone who can reach it could act as any agent; set auth.allowUnauthenticated=true to accept that" }}
{{- end }}
{{- if and (eq $mode "token") (not .Values.auth.token.secretName) }}
{{- fail "auth.mode token: set auth.token.secretName (a Secret with the tokens file)" }}
{{- end }}
{{- if and (eq $mode "mtls") (not (and (include "agenttx.tls.enabled" .) .Values.tls.clientAuth)) }}
{{- fail "auth.mode mtls: needs client certificates: set tls.secretName or tls.certManager.enabled, and tls.clientAuth=true" }}
{{- end }}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) }}
{{- fail "tls.certManager.enabled: set tls.certManager.issuerRef.name (an Issuer or ClusterIssuer your agents trust)" }}
{{- end }}
{{- end }}

{{/*
Replica processes per service pod (`agenttx serve --workers`): service.workers, or when 0
one per whole CPU of resources.limits.cpu, rounded up ("1500m" -> 2, "2" -> 2); 1 without
a CPU limit. At most 64 (the setting's range).
*/}}
{{- define "agenttx.service.workers" -}}
{{- $svc := .Values.service -}}
{{- $n := int ($svc.workers | default 0) -}}
{{- if eq $n 0 -}}
{{- $cpu := "" -}}
{{- with $svc.resources }}{{ with .limits }}{{ with .cpu }}{{ $cpu = toString . }}{{ end }}{{ end }}{{ end -}}
{{- if not $cpu -}}
{{- $n = 1 -}}
{{- else if hasSuffix "m" $cpu -}}
{{- $n = div (add (atoi (trimSuffix "m" $cpu)) 999) 1000 -}}
{{- else -}}
{{- $n = int (ceil (float64 $cpu)) -}}
{{- end -}}
{{- end -}}
{{- min (max $n 1) 64 -}}
{{- end -}}

{{/*
The metrics port names of a service pod: `metrics` for worker 0, `metrics-w<i>` for the
others (each worker serves its own /metrics on metrics.port + i).
*/}}
{{- define "agenttx.service.metricsPorts" -}}
{{- $n := int (include "agenttx.service.workers" .) -}}
{{- range $i := until $n }}
- name: {{ if eq $i 0 }}metrics{{ else }}metrics-w{{ $i }}{{ end }}
  port: {{ add $.Values.metrics.port $i }}
{{- end }}
{{- end -}}
