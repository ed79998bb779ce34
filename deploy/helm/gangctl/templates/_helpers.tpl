{{/* Labels every object carries (the kustomize manifests have the first; Helm's own are extra). */}}
{{- define "gangctl.labels" -}}
app.kubernetes.io/name: gangctl
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gangctl.controllerLabels" -}}
{{ include "gangctl.labels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "gangctl.selectorLabels" -}}
app.kubernetes.io/name: gangctl
app.kubernetes.io/component: controller
{{- end -}}

{{/* gangctl reads its quota policy ConfigMap from gangctl-system (gangctl/policy/quota_coscheduling.py). */}}
{{- define "gangctl.checkNamespace" -}}
{{- if ne .Release.Namespace "gangctl-system" -}}
{{- fail "install gangctl into the namespace gangctl-system (helm install ... -n gangctl-system --create-namespace): it reads its quota policy ConfigMap there" -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicas > 1 needs leaderElection.enabled: two controllers without a leader would both write" -}}
{{- end -}}
{{- end -}}
