"""Test and benchmark harnesses, never imported by the product.

They drive a real cluster the way a test or a benchmark needs: `chaos` (scripted node outages and
failing exits), `audit` (a pod watch that proves no index ever ran twice), `peer` (installs Kubeflow
Trainer, the Training Operator and JobSet for side-by-side runs), `incluster` (gangctl as a Deployment
on the local cluster's process nodes). import-linter keeps every product package from importing them.
"""
