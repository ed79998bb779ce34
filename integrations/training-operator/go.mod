// Wrapper module that pins Kubeflow Training Operator v1.9.4, the newest v1.9 patch the Go module
// proxy serves. gangctl does not build it here: tests/unit/test_pytorchjob.py downloads the module
// (`go mod download`) to check deploy/pytorchjob/ against its own PyTorchJob CRD; the PyTorchJob
// benchmark beside Training Operator (issue 15) will build cmd/training-operator.v1 from this pin.
module gangctl.local/training-operator

go 1.26.0
