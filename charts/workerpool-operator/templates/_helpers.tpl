{{/* The chart name, or nameOverride. */}}
{{- define "workerpool-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release
name when it already contains the chart name, else "<release>-<chart>".
*/}}
{{- define "workerpool-operator.fullname" -}}
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

{{- define "workerpool-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The recommended labels, on every object. */}}
{{- define "workerpool-operator.labels" -}}
helm.sh/chart: {{ include "workerpool-operator.chart" . }}
{{ include "workerpool-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: workerpool
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels that select the operator's pods; never change them in an upgrade. */}}
{{- define "workerpool-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "workerpool-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "workerpool-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "workerpool-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "workerpool-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "workerpool-operator.leaseName" -}}
{{- default (include "workerpool-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/* The runbook link of an alert: (list $ "AlertName"). */}}
{{- define "workerpool-operator.runbookUrl" -}}
{{- $root := index . 0 -}}
{{- $base := $root.Values.prometheusRule.runbookBaseUrl | default (printf "https://github.com/workerpool-dev/workerpool/blob/v%s/charts/workerpool-operator/README.md" $root.Chart.AppVersion) -}}
{{- printf "%s#%s" $base (index . 1 | lower) -}}
{{- end }}
