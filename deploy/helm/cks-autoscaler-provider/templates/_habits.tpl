{{/*
Refusals of values written for upstream's cluster-autoscaler chart (kubernetes/autoscaler,
charts/cluster-autoscaler, values.yaml at tag cluster-autoscaler-chart-9.51.0, the last release
of that chart for cluster-autoscaler 1.33). There the chart deploys the autoscaler alone, so its
top-level values are the autoscaler's; here the top-level values are the provider's and the
autoscaler's are under `autoscaler.`. A value upstream's chart takes that this chart would
ignore, or give to the wrong container, is refused with a message saying where this chart takes
it, every such value of one values file in one message. The README's migration table lists every
mapping.
*/}}

{{/* The non-comment lines of a file under files/: `path` and the chart root `root`. */}}
{{- define "cks-autoscaler-provider.fileLines" -}}
{{- $lines := list -}}
{{- range (.root.Files.Get .path | splitList "\n") -}}
{{- $line := trim . -}}
{{- if and $line (not (hasPrefix "#" $line)) -}}
{{- $lines = append $lines $line -}}
{{- end -}}
{{- end -}}
{{- toJson $lines -}}
{{- end -}}

{{/* The flag names an extraArgs helper's JSON names: `--name=value` and `--name`; list items
that are no flag (the value of `--name value`) are skipped. */}}
{{- define "cks-autoscaler-provider.argNames" -}}
{{- $names := list -}}
{{- range (. | fromJsonArray) -}}
{{- if hasPrefix "-" (toString .) -}}
{{- $names = append $names (regexReplaceAll "^-+" (regexReplaceAll "=.*$" (toString .) "") "") -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "cks-autoscaler-provider.validateHabits" -}}
{{- $v := .Values -}}
{{- $serveFlags := include "cks-autoscaler-provider.fileLines" (dict "root" . "path" "files/serve-flags.txt") | fromJsonArray -}}
{{- $autoscalerFlags := include "cks-autoscaler-provider.fileLines" (dict "root" . "path" "files/autoscaler-flags.txt") | fromJsonArray -}}
{{- if not $serveFlags -}}
{{- fail "files/serve-flags.txt is missing from the chart: it lists the flags top-level extraArgs may name" -}}
{{- end -}}
{{- /* Every refusal is collected and reported at once: an upstream values file carries several
habits, and one render per habit would take as many rounds. */ -}}
{{- $problems := list -}}
{{- $unknownFlags := false -}}
{{- $why := "Top-level extraArgs take the flags of cks-autoscaler-provider serve (upstream's chart puts the autoscaler's there), and the provider would stop at start on a flag it does not know" -}}

{{- /* Upstream top-level values this chart has no such value for (upstream values.yaml, chart
9.51.0): each with where this chart takes it. */ -}}
{{- $cloudSpecific := "a setting of another cloud provider in upstream's chart. This chart runs the cluster-autoscaler with --cloud-provider=externalgrpc against the provider, which reads CloudStack's cloud-config from the Secret cloudConfig.secretName (key cloudConfig.key); the CKS clusters to scale are nodes[]" -}}
{{- $upstream := dict
  "autoscalingGroups" "upstream's node groups (name, minSize, maxSize). Here each CKS cluster is one node group: nodes[] with min, max and cluster (the CKS cluster's UUID or exact name), and client when the provider serves several clusters"
  "autoscalingGroupsnamePrefix" "upstream's node group name prefixes. Here each CKS cluster is one node group, named in nodes[] (min, max, cluster)"
  "autoDiscovery" "upstream's node group auto-discovery, which the externalgrpc provider does not do: list the CKS clusters in nodes[] (min, max, cluster)"
  "cloudProvider" "the chart always runs the cluster-autoscaler with --cloud-provider=externalgrpc, dialling the provider (or autoscaler.providerAddress): remove it"
  "cloudConfigPath" "the chart writes the autoscaler's externalgrpc cloud-config itself. CloudStack's cloud-config (api-url, api-key, secret-key) is read by the provider from the Secret cloudConfig.secretName, key cloudConfig.key"
  "secretKeyRefNameOverride" "CloudStack's credentials come from the Secret cloudConfig.secretName (key cloudConfig.key)"
  "kubeTargetVersionOverride" "set the cluster's Kubernetes minor as autoscaler.kubernetesMinor (quoted, \"1.33\"): it picks the cluster-autoscaler release (autoscaler.image.tagByKubernetesMinor)"
  "customArgs" "the cluster-autoscaler's arguments as written go in autoscaler.extraArgs, which takes a list of arguments as well as a map flag: value (top-level extraArgs are the provider's flags)"
  "containerSecurityContext" "the containers' security contexts are securityContext (the provider's container) and autoscaler.securityContext (the cluster-autoscaler's container); the pods' are podSecurityContext and autoscaler.podSecurityContext"
  "rbac" "the cluster-autoscaler's RBAC is autoscaler.rbac.create and autoscaler.rbac.additionalRules (rules appended to its ClusterRole), its ServiceAccount autoscaler.serviceAccount.create, .name, .annotations (rbac.serviceAccount.* upstream); the provider's Roles follow stateStore, leaderElection and confirmNodeMarks"
  "updateStrategy" "the cluster-autoscaler's strategy is autoscaler.updateStrategy; the provider's follows leader election (RollingUpdate one pod at a time with it, Recreate without) and is not a value"
  "envFromConfigMap" "use envFrom (the provider) or autoscaler.envFrom (the cluster-autoscaler): a list of envFrom sources, e.g. [{configMapRef: {name: NAME}}]"
  "envFromSecret" "use envFrom (the provider) or autoscaler.envFrom (the cluster-autoscaler): a list of envFrom sources, e.g. [{secretRef: {name: NAME}}]"
  "extraEnvConfigMaps" "use extraEnv or autoscaler.extraEnv entries with valueFrom.configMapKeyRef"
  "extraEnvSecrets" "use extraEnv or autoscaler.extraEnv entries with valueFrom.secretKeyRef"
  "extraVolumeSecrets" "use extraVolumes and extraVolumeMounts (or autoscaler.extraVolumes, autoscaler.extraVolumeMounts) with a secret volume"
  "expanderPriorities" "this chart creates no priority-expander ConfigMap: create cluster-autoscaler-priority-expander in the release namespace with extraObjects (the autoscaler's Role may read it) and set autoscaler.extraArgs.expander: priority"
  "priorityConfigMapAnnotations" "this chart creates no priority-expander ConfigMap: create cluster-autoscaler-priority-expander with extraObjects, annotations included"
  "additionalLabels" "this chart offers no labels on every object: podLabels and autoscaler.podLabels label the pods, serviceMonitor.labels and prometheusRule.labels those objects"
  "deployment" "this chart offers no Deployment annotations (deployment.annotations upstream): podAnnotations and autoscaler.podAnnotations annotate the pods"
  "hostNetwork" "this chart runs neither pod on the host network: the provider is reached through its Service, the autoscaler needs no host port"
  "vpa" "this chart creates no VerticalPodAutoscaler: create one with extraObjects; the containers' resources are resources and autoscaler.resources"
-}}
{{- range (list "awsAccessKeyID" "awsRegion" "awsSecretAccessKey" "azureClientID" "azureClientSecret" "azureResourceGroup" "azureSubscriptionID" "azureTenantID" "azureUseManagedIdentityExtension" "azureUserAssignedIdentityID" "azureUseWorkloadIdentityExtension" "azureVMType" "azureEnableForceDelete" "civoApiUrl" "civoApiKey" "civoClusterID" "civoRegion" "clusterAPICloudConfigPath" "clusterAPIConfigMapsNamespace" "clusterAPIKubeconfigSecret" "clusterAPIMode" "clusterAPIWorkloadKubeconfigPath" "kwokConfigMapName" "magnumCABundlePath" "magnumClusterName") -}}
{{- $_ := set $upstream . $cloudSpecific -}}
{{- end -}}
{{- range $key := (keys $upstream | sortAlpha) -}}
{{- if hasKey $v $key -}}
{{- $problems = append $problems (printf "%s is a value of upstream's cluster-autoscaler chart that this chart does not take: %s (the README's table \"Coming from upstream's cluster-autoscaler chart\")" $key (get $upstream $key)) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $v.autoscaler "containerSecurityContext" -}}
{{- $problems = append $problems "autoscaler.containerSecurityContext: the cluster-autoscaler container's security context is autoscaler.securityContext here (upstream's containerSecurityContext), its pod's autoscaler.podSecurityContext (upstream's securityContext)" -}}
{{- end -}}

{{- /* securityContext: upstream's is the pod's, this chart's the provider container's
(upstream's containerSecurityContext). Fields only a pod takes show the mix-up. */ -}}
{{- $podOnly := list "fsGroup" "fsGroupChangePolicy" "supplementalGroups" "supplementalGroupsPolicy" "sysctls" "seLinuxChangePolicy" -}}
{{- $containerOnly := list "allowPrivilegeEscalation" "privileged" "readOnlyRootFilesystem" "capabilities" "procMount" -}}
{{- range $where, $context := dict "securityContext" $v.securityContext "autoscaler.securityContext" $v.autoscaler.securityContext -}}
{{- range $podOnly -}}
{{- if hasKey ($context | default dict) . -}}
{{- $problems = append $problems (printf "%s.%s: %s is a container's security context in this chart (upstream's containerSecurityContext), and %s is a pod's field. Upstream's securityContext is the pod's: set it as %s" $where . $where . (ternary "podSecurityContext (the provider's pod; autoscaler.podSecurityContext for the cluster-autoscaler's)" "autoscaler.podSecurityContext" (eq $where "securityContext"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $where, $context := dict "podSecurityContext" $v.podSecurityContext "autoscaler.podSecurityContext" $v.autoscaler.podSecurityContext -}}
{{- range $containerOnly -}}
{{- if hasKey ($context | default dict) . -}}
{{- $problems = append $problems (printf "%s.%s: %s is a container's field, and %s the pod's security context: set it in %s" $where . . $where (ternary "securityContext (the provider's container)" "autoscaler.securityContext" (eq $where "podSecurityContext"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* image: upstream's is the cluster-autoscaler's, this chart's the provider's. */ -}}
{{- $tag := toString ($v.image.tag | default "") -}}
{{- if regexMatch `^v1\.[23][0-9]\.[0-9]+` $tag -}}
{{- $problems = append $problems (printf "image.tag %q looks like a cluster-autoscaler release (upstream's chart sets the autoscaler's image there): here image is the cks-autoscaler-provider image, whose tag defaults to the chart's appVersion %s. Set the autoscaler's release as autoscaler.image.tag, or leave it empty and set autoscaler.kubernetesMinor: the release autoscaler.image.tagByKubernetesMinor lists for that minor" $tag .Chart.AppVersion) -}}
{{- end -}}
{{- if regexMatch `(^|/)cluster-autoscaler$` (toString ($v.image.repository | default "")) -}}
{{- $problems = append $problems (printf "image.repository %q is the cluster-autoscaler's image (upstream's chart sets it there): here image is the cks-autoscaler-provider image, and the autoscaler's is autoscaler.image.repository" (toString $v.image.repository)) -}}
{{- end -}}

{{- /* Nested values upstream's chart takes under names this chart gives other meanings or
none. */ -}}
{{- $nested := dict
  "service" (dict "create" "autoscaler.service.create" "annotations" "autoscaler.service.annotations" "servicePort" "autoscaler.metricsPort" "portName" "none, the port is named metrics" "type" "externalService.type (the provider's gRPC port for other clusters)" "labels" "none" "externalIPs" "none" "clusterIP" "none" "loadBalancerIP" "none" "loadBalancerSourceRanges" "externalService.loadBalancerSourceRanges")
  "serviceMonitor" (dict "selector" "serviceMonitor.labels" "path" "none, both ServiceMonitors scrape /metrics" "annotations" "none")
  "prometheusRule" (dict "additionalLabels" "prometheusRule.labels" "interval" "none, the rule groups keep Prometheus' evaluation interval")
  "podDisruptionBudget" (dict "minAvailable" "podDisruptionBudget.maxUnavailable (with several replicas the chart keeps one: minAvailable 1 unless maxUnavailable is set)")
-}}
{{- $serviceWhy := "service is the provider's ClusterIP Service here (grpcPort, metricsPort); the cluster-autoscaler's metrics Service, upstream's service, is autoscaler.service" -}}
{{- range $parent := (keys $nested | sortAlpha) -}}
{{- $given := get $v $parent | default dict -}}
{{- $map := get $nested $parent -}}
{{- range $key := (keys $map | sortAlpha) -}}
{{- if hasKey $given $key -}}
{{- $problems = append $problems (printf "%s.%s is a value of upstream's cluster-autoscaler chart; this chart's equivalent: %s%s" $parent $key (get $map $key) (ternary (printf " (%s)" $serviceWhy) "" (eq $parent "service"))) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Top-level extraArgs: serve's flags only. */ -}}
{{- range (include "cks-autoscaler-provider.argNames" (include "cks-autoscaler-provider.extraArgs" $v.extraArgs) | fromJsonArray) -}}
{{- if not (has . $serveFlags) -}}
{{- if eq . "v" -}}
{{- $problems = append $problems (printf "extraArgs.v: --v is the cluster-autoscaler's log verbosity. %s. Set the autoscaler's as autoscaler.verbosity; the provider's log level is log.filter (a RUST_LOG filter such as info or debug)" $why) -}}
{{- else if has . (list "cloud-provider" "namespace" "address") -}}
{{- $problems = append $problems (printf "extraArgs.%s: --%s is a cluster-autoscaler flag that this chart sets itself (%s). %s" . . (get (dict "cloud-provider" "always externalgrpc" "namespace" "the release namespace" "address" "autoscaler.metricsPort") .) $why) -}}
{{- else if has . $autoscalerFlags -}}
{{- $problems = append $problems (printf "extraArgs.%s: --%s is a cluster-autoscaler flag. %s. Set it in autoscaler.extraArgs" . . $why) -}}
{{- else -}}
{{- $problems = append $problems (printf "extraArgs.%s: --%s is not a flag of cks-autoscaler-provider serve. %s. The cluster-autoscaler's flags go in autoscaler.extraArgs" . . $why) -}}
{{- $unknownFlags = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* autoscaler.extraArgs: a serve flag the autoscaler does not have is the reverse mix-up. */ -}}
{{- range (include "cks-autoscaler-provider.argNames" (include "cks-autoscaler-provider.extraArgs" $v.autoscaler.extraArgs) | fromJsonArray) -}}
{{- if and (has . $serveFlags) (not (has . $autoscalerFlags)) -}}
{{- $problems = append $problems (printf "autoscaler.extraArgs.%s: --%s is a flag of cks-autoscaler-provider serve, not of the cluster-autoscaler (which would stop at start on it): set it in top-level extraArgs" . .) -}}
{{- end -}}
{{- end -}}
{{- if $problems -}}
{{- $flags := ternary (printf "\nserve's flags: %s" (join ", " $serveFlags)) "" $unknownFlags -}}
{{- if eq (len $problems) 1 -}}
{{- fail (printf "%s%s" (first $problems) $flags) -}}
{{- else -}}
{{- fail (printf "%d values refused at once (written as for upstream's cluster-autoscaler chart), each with where this chart takes it:\n- %s%s" (len $problems) (join "\n- " $problems) $flags) -}}
{{- end -}}
{{- end -}}
{{- end -}}
