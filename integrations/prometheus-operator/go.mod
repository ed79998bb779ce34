// Pins prometheus-operator, whose ServiceMonitor and PrometheusRule CRDs (example/prometheus-operator-crd/)
// tests/integration/test_deploy.py reads from the Go module cache to dry-run deploy/overlays/monitoring
// against the real API server. Nothing is built from this module.
module gangctl.local/prometheusoperator

go 1.25.0

require (
	github.com/prometheus-operator/prometheus-operator v0.88.0
)
