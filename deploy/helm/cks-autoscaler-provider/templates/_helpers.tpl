{{/* Chart name. */}}
{{- define "cks-autoscaler-provider.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the provider's objects; also the Service name, hence the gRPC host. */}}
{{- define "cks-autoscaler-provider.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of the autoscaler's objects. */}}
{{- define "cks-autoscaler-provider.autoscalerName" -}}
{{- printf "%s-autoscaler" (include "cks-autoscaler-provider.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cks-autoscaler-provider.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cks-autoscaler-provider.commonLabels" -}}
helm.sh/chart: {{ include "cks-autoscaler-provider.chart" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: cks-autoscaler
{{- end -}}

{{/* Provider selector labels. */}}
{{- define "cks-autoscaler-provider.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cks-autoscaler-provider.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cks-autoscaler-provider.labels" -}}
{{ include "cks-autoscaler-provider.commonLabels" . }}
{{ include "cks-autoscaler-provider.selectorLabels" . }}
app.kubernetes.io/component: cloud-provider
{{- end -}}

{{/* Autoscaler selector labels (the NetworkPolicy admits these pods to the gRPC port). */}}
{{- define "cks-autoscaler-provider.autoscalerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cks-autoscaler-provider.name" . }}-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cks-autoscaler-provider.autoscalerLabels" -}}
{{ include "cks-autoscaler-provider.commonLabels" . }}
{{ include "cks-autoscaler-provider.autoscalerSelectorLabels" . }}
app.kubernetes.io/component: autoscaler
{{- end -}}

{{- define "cks-autoscaler-provider.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The cluster-autoscaler image: autoscaler.image.tag when set, else the release
autoscaler.image.tagByKubernetesMinor lists for autoscaler.kubernetesMinor, else for the minor of
the cluster Helm talks to (some distributions report "28+").
*/}}
{{- define "cks-autoscaler-provider.autoscalerImage" -}}
{{- $image := .Values.autoscaler.image -}}
{{- $tag := $image.tag -}}
{{- if not $tag -}}
{{- $minor := .Values.autoscaler.kubernetesMinor -}}
{{- if kindIs "float64" $minor -}}
{{- fail (printf "autoscaler.kubernetesMinor must be a quoted string such as \"1.30\", not the number %v" $minor) -}}
{{- end -}}
{{- if not $minor -}}
{{- $minor = printf "%s.%s" .Capabilities.KubeVersion.Major (trimSuffix "+" .Capabilities.KubeVersion.Minor) -}}
{{- end -}}
{{- $tag = index $image.tagByKubernetesMinor $minor -}}
{{- if not $tag -}}
{{- fail (printf "no cluster-autoscaler release is listed for Kubernetes %s (autoscaler.image.tagByKubernetesMinor has %s): set autoscaler.image.tag" $minor (keys $image.tagByKubernetesMinor | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}

{{- define "cks-autoscaler-provider.serverTlsSecret" -}}
{{- default (printf "%s-tls" (include "cks-autoscaler-provider.fullname" .)) .Values.tls.serverSecretName -}}
{{- end -}}

{{- define "cks-autoscaler-provider.clientTlsSecret" -}}
{{- default (printf "%s-autoscaler-client" (include "cks-autoscaler-provider.fullname" .)) .Values.tls.clientSecretName -}}
{{- end -}}

{{/* The host the autoscaler dials; the server certificate is issued for it. */}}
{{- define "cks-autoscaler-provider.grpcHost" -}}
{{- printf "%s.%s.svc" (include "cks-autoscaler-provider.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Mount paths inside the containers. */}}
{{- define "cks-autoscaler-provider.configDir" -}}/etc/cks-provider{{- end -}}
{{- define "cks-autoscaler-provider.tlsDir" -}}/tls{{- end -}}
{{- define "cks-autoscaler-provider.clientTlsDir" -}}/etc/cluster-autoscaler/tls{{- end -}}
