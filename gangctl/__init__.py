"""gangctl: gang-scheduled, elastic PyTorch training on Kubernetes."""
