{{/* Chart name. */}}
{{- define "cks-autoscaler-provider.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ConfigMap the provider records its promises in (stateStore=configmap). */}}
{{- define "cks-autoscaler-provider.stateConfigMap" -}}
{{- printf "%s-state" (include "cks-autoscaler-provider.fullname" . | trunc 57 | trimSuffix "-") -}}
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

{{/*
Name of the autoscaler's objects. Release `cks-autoscaler-provider` gives the names of the
kustomize base: provider `cks-autoscaler-provider`, autoscaler `cks-cluster-autoscaler`
(`<release>-cks-cluster-autoscaler` for another release name).
*/}}
{{- define "cks-autoscaler-provider.autoscalerName" -}}
{{- $full := include "cks-autoscaler-provider.fullname" . -}}
{{- if hasSuffix "-autoscaler-provider" $full -}}
{{- printf "%s-cluster-autoscaler" (trimSuffix "-autoscaler-provider" $full) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-autoscaler" $full | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Prefix of the objects both sides share: the private CA and its issuers (`cks-autoscaler-ca`,
`cks-autoscaler-ca-issuer`, as in the kustomize base) and the client certificates issued for
autoscalers in other clusters (`cks-autoscaler-client-<client>`).
*/}}
{{- define "cks-autoscaler-provider.pairName" -}}
{{- trimSuffix "-provider" (include "cks-autoscaler-provider.fullname" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* The ServiceAccount the autoscaler runs as. */}}
{{- define "cks-autoscaler-provider.autoscalerServiceAccount" -}}
{{- if .Values.autoscaler.serviceAccount.create -}}
{{- default (include "cks-autoscaler-provider.autoscalerName" .) .Values.autoscaler.serviceAccount.name -}}
{{- else -}}
{{- required "autoscaler.serviceAccount.create=false: set autoscaler.serviceAccount.name to the ServiceAccount the autoscaler runs as (it must exist and be bound to the autoscaler's roles)" .Values.autoscaler.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The identity of this release's autoscaler: the DNS name in its client certificate, which a
provider's `--nodes MIN:MAX:CLUSTER@CLIENT` names.
*/}}
{{- define "cks-autoscaler-provider.autoscalerClient" -}}
{{- default (include "cks-autoscaler-provider.autoscalerName" .) .Values.autoscaler.client -}}
{{- end -}}

{{- define "cks-autoscaler-provider.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels every object carries besides its selector labels. No app.kubernetes.io/instance here:
the selector labels carry it, and a key written twice in one mapping is invalid YAML.
*/}}
{{- define "cks-autoscaler-provider.commonLabels" -}}
helm.sh/chart: {{ include "cks-autoscaler-provider.chart" . }}
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
{{ include "cks-autoscaler-provider.selectorLabels" . }}
{{ include "cks-autoscaler-provider.commonLabels" . }}
app.kubernetes.io/component: cloud-provider
{{- end -}}

{{/*
Autoscaler selector labels (the NetworkPolicy admits these pods to the gRPC port). The name is
the one the kustomize base gives its autoscaler.
*/}}
{{- define "cks-autoscaler-provider.autoscalerSelectorLabels" -}}
app.kubernetes.io/name: cks-cluster-autoscaler
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cks-autoscaler-provider.autoscalerLabels" -}}
{{ include "cks-autoscaler-provider.autoscalerSelectorLabels" . }}
{{ include "cks-autoscaler-provider.commonLabels" . }}
app.kubernetes.io/component: autoscaler
{{- end -}}

{{/* Labels of the certificate objects (CA, issuers, leaf certificates). */}}
{{- define "cks-autoscaler-provider.tlsLabels" -}}
app.kubernetes.io/name: {{ include "cks-autoscaler-provider.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{ include "cks-autoscaler-provider.commonLabels" . }}
app.kubernetes.io/component: tls
{{- end -}}

{{/*
The provider image: repository@digest when image.digest is set (the tag is then ignored), else
repository:tag (the chart's appVersion by default). The validate helper refuses an empty
repository before anything renders.
*/}}
{{- define "cks-autoscaler-provider.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}
{{- end -}}

{{/*
The pull secrets of both pods: image.pullSecrets (names) and imagePullSecrets (`name:`
entries, or names), each once.
*/}}
{{- define "cks-autoscaler-provider.imagePullSecrets" -}}
{{- $names := list -}}
{{- range (concat (.Values.image.pullSecrets | default list) (.Values.imagePullSecrets | default list)) -}}
{{- if kindIs "map" . -}}
{{- $names = append $names (toString (required "imagePullSecrets: every entry needs a `name`" .name)) -}}
{{- else -}}
{{- $names = append $names (toString .) -}}
{{- end -}}
{{- end -}}
{{- range ($names | uniq) }}
- name: {{ . }}
{{- end -}}
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
{{- if $minor -}}
{{- /* What `kubectl version` prints (v1.31.4, 1.31.4+k3s1) names its minor without doubt: take
it, rather than refuse a value whose meaning is plain. */ -}}
{{- $minor = toString $minor -}}
{{- if not (regexMatch `^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+].*)?$` $minor) -}}
{{- fail (printf "autoscaler.kubernetesMinor %q is no Kubernetes version: write the minor, quoted, such as \"1.31\" (the Server Version of kubectl version, v1.31.4, is minor 1.31)" $minor) -}}
{{- end -}}
{{- $minor = regexFind `^[0-9]+\.[0-9]+` (trimPrefix "v" $minor) -}}
{{- else -}}
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
{{- default (printf "%s-grpc-client" (include "cks-autoscaler-provider.autoscalerName" .)) .Values.tls.clientSecretName -}}
{{- end -}}

{{/*
The clients named in `nodes[].client` whose certificates this release issues for autoscalers
outside it (every name but this release's own autoscaler's), sorted and without repeats.
*/}}
{{- define "cks-autoscaler-provider.remoteClients" -}}
{{- $own := "" -}}
{{- if .Values.autoscaler.enabled -}}
{{- $own = include "cks-autoscaler-provider.autoscalerClient" . -}}
{{- end -}}
{{- $clients := list -}}
{{- range .Values.nodes -}}
{{- if and .client (ne .client $own) -}}
{{- $clients = append $clients .client -}}
{{- end -}}
{{- end -}}
{{- $clients | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* The address the autoscaler dials: this release's Service, or a central provider. */}}
{{- define "cks-autoscaler-provider.providerAddress" -}}
{{- if .Values.provider.enabled -}}
{{- printf "%s:%v" (include "cks-autoscaler-provider.grpcHost" .) .Values.service.grpcPort -}}
{{- else -}}
{{- required "provider.enabled=false: set autoscaler.providerAddress to the central provider's host:port (its host must be in that provider's server certificate: tls.extraDnsNames or tls.extraIpAddresses there)" .Values.autoscaler.providerAddress -}}
{{- end -}}
{{- end -}}

{{/*
Refuses values the provider or the autoscaler could not run with, as `serve` refuses them:
several clusters without a client bound to each, a workload-cluster autoscaler without TLS, a
central provider no NetworkPolicy rule lets anyone reach.
*/}}
{{- define "cks-autoscaler-provider.validate" -}}
{{- include "cks-autoscaler-provider.validateHabits" . -}}
{{- if not (or .Values.provider.enabled .Values.autoscaler.enabled) -}}
{{- fail "provider.enabled and autoscaler.enabled are both false: nothing to deploy" -}}
{{- end -}}
{{- if .Values.provider.enabled -}}
{{- if not (has .Values.stateStore (list "configmap" "file" "none")) -}}
{{- fail (printf "stateStore %v: configmap (the default), file or none" .Values.stateStore) -}}
{{- end -}}
{{- if and .Values.stateFile.existingClaim (ne .Values.stateStore "file") -}}
{{- fail "stateFile.existingClaim is set and stateStore is not file: set stateStore=file to record the promises on that claim (or leave existingClaim empty)" -}}
{{- end -}}
{{- if and (not .Values.stateFile.enabled) (ne .Values.stateStore "none") -}}
{{- fail "stateFile.enabled=false: set stateStore=none to record nothing (stateFile.enabled is kept for earlier values files)" -}}
{{- end -}}
{{- $replicas := .Values.replicaCount -}}
{{- if lt (int $replicas) 1 -}}
{{- fail (printf "replicaCount %v: 1 or more (provider.enabled=false deploys no provider)" $replicas) -}}
{{- end -}}
{{- $leaderElect := include "cks-autoscaler-provider.leaderElect" . -}}
{{- if and (gt (int $replicas) 1) (not $leaderElect) -}}
{{- fail (printf "replicaCount %v with leaderElection.enabled=false: two providers would both act on the same clusters (each submitting scale jobs, each deleting the VMs it thinks unregistered). Leave leaderElection.enabled empty (on with more than one replica), or set replicaCount: 1" (toString $replicas)) -}}
{{- end -}}
{{- if and $leaderElect (ne .Values.stateStore "configmap") -}}
{{- fail (printf "leader election (replicaCount %v) needs stateStore=configmap: the replicas share the promises recorded in that ConfigMap, and the standby takes them over when it becomes the leader; stateStore=%v keeps them where only one pod sees them. Set stateStore=configmap, or replicaCount: 1 (and leaderElection.enabled empty or false)" (toString $replicas) .Values.stateStore) -}}
{{- end -}}
{{- if not .Values.nodes -}}
{{- fail "set at least one entry in `nodes` (min, max, cluster): the CKS clusters to scale" -}}
{{- end -}}
{{- $clusters := list -}}
{{- range .Values.nodes -}}
{{- $clusters = append $clusters (toString (required "nodes[].cluster is required" .cluster)) -}}
{{- if .client -}}
{{- if not (regexMatch `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$` (toString .client)) -}}
{{- fail (printf "nodes[].client %q is not a lowercase DNS name: it is matched against the DNS names of client certificates" (toString .client)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (len ($clusters | uniq)) 1 -}}
{{- range .Values.nodes -}}
{{- if not .client -}}
{{- fail (printf "nodes: cluster %v has no `client`. With more than one cluster every entry names the client (the DNS name of the autoscaler's client certificate) that may see and scale it: client binding keeps each cluster's autoscaler to its own cluster, and the provider refuses to start without it" .cluster) -}}
{{- end -}}
{{- end -}}
{{- if not .Values.tls.enabled -}}
{{- fail "nodes: more than one cluster needs client certificates (tls.enabled=true): client binding matches the autoscaler's verified certificate" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not .Values.autoscaler.enabled) (not .Values.networkPolicy.extraGrpcClients) -}}
{{- fail "networkPolicy: autoscaler.enabled=false and no networkPolicy.extraGrpcClients: nothing could reach the gRPC port. List where the workload clusters' autoscalers connect from (ipBlock peers), or set networkPolicy.enabled=false" -}}
{{- end -}}
{{- if and .Values.prometheusRule.enabled (not .Values.serviceMonitor.enabled) (not .Values.prometheusRule.selector) -}}
{{- fail "prometheusRule.enabled: its alerts select the provider's series by the job the chart's ServiceMonitor gives them, and serviceMonitor.enabled=false creates none. Enable serviceMonitor.enabled, or set prometheusRule.selector to the PromQL matchers your own scrape gives the provider's series (e.g. job=\"kubernetes-pods\", namespace=\"kube-system\")" -}}
{{- end -}}
{{- $providerOwned := dict "nodes" "nodes[]" "listen" "service.grpcPort" "metrics-listen" "service.metricsPort" "cloud-config" "cloudConfig" "config" "config" "cloudstack-ca" "cloudstackCA" "tls-cert" "tls.enabled" "tls-key" "tls.enabled" "tls-client-ca" "tls.enabled" "insecure" "tls.enabled=false" "log-format" "log.format" "max-node-provision-time" "autoscaler.maxNodeProvisionTime (the autoscaler gets the same value)" "state-file" "stateStore=file" "state-configmap" "stateStore=configmap" "state-namespace" "stateStore=configmap (the release namespace)" "leader-elect" "replicaCount and leaderElection.enabled" "leader-elect-lease-duration" "leaderElection.leaseDuration" "leader-elect-renew-deadline" "leaderElection.renewDeadline" "leader-elect-retry-period" "leaderElection.retryPeriod" "leader-elect-resource-name" "leaderElection.resourceName" "leader-elect-resource-namespace" "nothing: the Lease is in the release namespace, where its Role is" "admin-listen" "adminListen" -}}
{{- include "cks-autoscaler-provider.refuseOwnedArgs" (dict "args" (include "cks-autoscaler-provider.extraArgs" .Values.extraArgs) "where" "extraArgs" "owned" $providerOwned) -}}
{{- include "cks-autoscaler-provider.validateBudget" . -}}
{{- if and .Values.cloudstackCA.configMapName .Values.cloudstackCA.secretName -}}
{{- fail "cloudstackCA: set configMapName or secretName, not both" -}}
{{- end -}}
{{- end -}}
{{- if .Values.autoscaler.enabled -}}
{{- $autoscalerOwned := dict "cloud-provider" "nothing: it is externalgrpc" "cloud-config" "nothing: the chart writes it" "namespace" "nothing: it is the release namespace" "address" "autoscaler.metricsPort" "v" "autoscaler.verbosity" "max-node-provision-time" "autoscaler.maxNodeProvisionTime (the provider gets the same value)" "nodes" "nodes[]: with externalgrpc the provider's --nodes count, the autoscaler's have no effect" -}}
{{- include "cks-autoscaler-provider.refuseOwnedArgs" (dict "args" (include "cks-autoscaler-provider.extraArgs" .Values.autoscaler.extraArgs) "where" "autoscaler.extraArgs" "owned" $autoscalerOwned) -}}
{{- end -}}
{{- if and (not .Values.provider.enabled) (not .Values.tls.enabled) -}}
{{- fail "provider.enabled=false: the autoscaler dials a provider in another cluster, which needs mutual TLS (tls.enabled=true)" -}}
{{- end -}}
{{- if .Values.provider.enabled -}}
{{- include "cks-autoscaler-provider.validateImage" . -}}
{{- end -}}
{{- end -}}

{{/*
The provider image must be named: no public image exists (the default a chart usually carries
would be a Docker Hub name nobody pushed). Checked after the other refusals, so that each of
those is reported for what it is.
*/}}
{{- define "cks-autoscaler-provider.validateImage" -}}
{{- $image := .Values.image -}}
{{- if not $image.repository -}}
{{- fail "image.repository is required: no public image of cks-autoscaler-provider exists. Build it with the Dockerfile at the repository's root, push it to a registry the cluster pulls from (docs/operations.md §2.1: docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/cks-autoscaler-provider:TAG --push .) and set image.repository=REGISTRY/cks-autoscaler-provider (with image.tag, or image.digest)" -}}
{{- end -}}
{{- if regexMatch `(@|:[^/]*$)` (toString $image.repository) -}}
{{- fail (printf "image.repository %q carries a tag or a digest: give the repository alone, the tag in image.tag, the digest in image.digest" (toString $image.repository)) -}}
{{- end -}}
{{- if and $image.digest (not (regexMatch `^sha256:[0-9a-f]{64}$` (toString $image.digest))) -}}
{{- fail (printf "image.digest %q is not a digest: sha256: and 64 lowercase hex digits (docker buildx imagetools inspect REPOSITORY:TAG shows it)" (toString $image.digest)) -}}
{{- end -}}
{{- end -}}

{{/* The host the autoscaler dials; the server certificate is issued for it. */}}
{{- define "cks-autoscaler-provider.grpcHost" -}}
{{- printf "%s.%s.svc" (include "cks-autoscaler-provider.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Mount paths inside the containers. */}}
{{- define "cks-autoscaler-provider.configDir" -}}/etc/cks-provider{{- end -}}
{{- define "cks-autoscaler-provider.tlsDir" -}}/tls{{- end -}}
{{- define "cks-autoscaler-provider.clientTlsDir" -}}/etc/cluster-autoscaler/tls{{- end -}}
{{- define "cks-autoscaler-provider.cloudstackCaDir" -}}/etc/cloudstack-ca{{- end -}}

{{/*
The PromQL matchers the chart's alerts select the provider's series by: prometheusRule.selector,
else the job the chart's ServiceMonitor gives them (the Prometheus Operator names it after the
Service) in the release namespace.
*/}}
{{- define "cks-autoscaler-provider.ruleSelector" -}}
{{- default (printf "job=%q, namespace=%q" (include "cks-autoscaler-provider.fullname" .) .Release.Namespace) .Values.prometheusRule.selector -}}
{{- end -}}

{{/*
The PromQL matchers of the autoscaler's series in the alerts: prometheusRule.autoscalerSelector,
else the job this chart's ServiceMonitor gives them when it creates one, else empty (the
autoscaler's alerts are left out).
*/}}
{{- define "cks-autoscaler-provider.autoscalerRuleSelector" -}}
{{- if .Values.prometheusRule.autoscalerSelector -}}
{{- .Values.prometheusRule.autoscalerSelector -}}
{{- else if and .Values.autoscaler.enabled .Values.autoscaler.service.create .Values.serviceMonitor.enabled -}}
{{- printf "job=%q, namespace=%q" (include "cks-autoscaler-provider.autoscalerName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
Extra command-line arguments, as JSON: `extraArgs` (or autoscaler.extraArgs) as upstream's
cluster-autoscaler chart takes them, a map `name: value` giving --name=value (null: --name
alone; a list: --name=item for each; a `_suffix` on the name lets one flag come twice:
`nodes_2`), or, as this chart took them before, a list of arguments as written. The map's
flags come sorted by name.
*/}}
{{- define "cks-autoscaler-provider.extraArgs" -}}
{{- $args := list -}}
{{- if kindIs "slice" . -}}
{{- range . -}}
{{- $args = append $args (toString .) -}}
{{- end -}}
{{- else if kindIs "map" . -}}
{{- range $key, $value := . -}}
{{- $name := regexFind "^[^_]+" $key -}}
{{- if kindIs "invalid" $value -}}
{{- $args = append $args (printf "--%s" $name) -}}
{{- else if kindIs "slice" $value -}}
{{- range $value -}}
{{- $args = append $args (printf "--%s=%v" $name .) -}}
{{- end -}}
{{- else -}}
{{- $args = append $args (printf "--%s=%v" $name $value) -}}
{{- end -}}
{{- end -}}
{{- else if . -}}
{{- fail (printf "extraArgs must be a map (flag name: value) or a list of arguments, not %v" .) -}}
{{- end -}}
{{- toJson $args -}}
{{- end -}}

{{/*
Refuses extra arguments that name a flag the chart sets from a value of its own: `args` (the
extraArgs helper's JSON), `where` (the values key), `owned` (a dict: flag name -> the value
that sets it).
*/}}
{{- define "cks-autoscaler-provider.refuseOwnedArgs" -}}
{{- range (.args | fromJsonArray) -}}
{{- $name := regexReplaceAll "^-+" (regexReplaceAll "=.*$" (toString .) "") "" -}}
{{- if hasKey $.owned $name -}}
{{- fail (printf "%s sets --%s, which the chart sets itself: use %s" $.where $name (get $.owned $name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when the provider reads the Nodes of its one cluster (--confirm-node-marks):
confirmNodeMarks on, the provider and its cluster's autoscaler in this release, one nodes entry. */}}
{{- define "cks-autoscaler-provider.confirmNodeMarks" -}}
{{- if and .Values.provider.enabled .Values.confirmNodeMarks .Values.autoscaler.enabled (eq (len .Values.nodes) 1) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the provider replicas elect a leader (--leader-elect): leaderElection.enabled,
or, when that is empty (null), replicaCount above 1. */}}
{{- define "cks-autoscaler-provider.leaderElect" -}}
{{- $enabled := .Values.leaderElection.enabled -}}
{{- if kindIs "invalid" $enabled -}}
{{- $enabled = gt (int .Values.replicaCount) 1 -}}
{{- end -}}
{{- if and .Values.provider.enabled $enabled -}}
true
{{- end -}}
{{- end -}}

{{/* The leader-election Lease's name (release namespace): leaderElection.resourceName, else
the provider's full name. */}}
{{- define "cks-autoscaler-provider.leaseName" -}}
{{- default (include "cks-autoscaler-provider.fullname" .) .Values.leaderElection.resourceName -}}
{{- end -}}

{{/* The label the leader sets on its own pod, which the provider's Services select. */}}
{{- define "cks-autoscaler-provider.leaderLabel" -}}
cks-autoscaler-provider/role: leader
{{- end -}}

{{/*
Extra environment variables, as YAML list items: a list of EnvVar entries (name, value or
valueFrom), or, as upstream's cluster-autoscaler chart takes extraEnv, a map `NAME: value`
(sorted by name). `where` names the value in the refusal of anything else.
*/}}
{{- define "cks-autoscaler-provider.env" -}}
{{- $env := .env -}}
{{- if kindIs "slice" $env -}}
{{- if $env }}
{{ toYaml $env }}
{{- end -}}
{{- else if kindIs "map" $env -}}
{{- range $name := (keys $env | sortAlpha) }}
- name: {{ $name | quote }}
  value: {{ get $env $name | toString | quote }}
{{- end -}}
{{- else if $env -}}
{{- fail (printf "%s must be a list of env entries (name, value or valueFrom) or a map NAME: value, not %v" .where $env) -}}
{{- end -}}
{{- end -}}

{{/*
podDisruptionBudget.maxUnavailable: a whole number that still lets a drain remove the provider's
node (1 or more) and, with several replicas, keeps one running (below replicaCount), so that the
standby can take over from an evicted leader (docs/operations.md §2.7).
*/}}
{{- define "cks-autoscaler-provider.validateBudget" -}}
{{- $max := .Values.podDisruptionBudget.maxUnavailable -}}
{{- if and .Values.podDisruptionBudget.enabled (not (kindIs "invalid" $max)) -}}
{{- $replicas := int .Values.replicaCount -}}
{{- if not (or (kindIs "int" $max) (kindIs "int64" $max) (and (kindIs "float64" $max) (eq (float64 (int $max)) $max))) -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable %v: a whole number of provider pods (a percentage of one or two replicas rounds to nothing useful)" $max) -}}
{{- end -}}
{{- if lt (int $max) 1 -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable %v: 1 or more. 0 keeps every drain, and the cluster-autoscaler, from ever removing the node the provider runs on" $max) -}}
{{- end -}}
{{- if and (gt $replicas 1) (ge (int $max) $replicas) -}}
{{- fail (printf "podDisruptionBudget.maxUnavailable %v with replicaCount %d: below %d, so that a drain leaves a replica to take over from the leader (docs/operations.md §2.7). Leave it empty for the chart's minAvailable 1" $max $replicas $replicas) -}}
{{- end -}}
{{- end -}}
{{- end -}}
