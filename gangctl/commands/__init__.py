"""The I/O halves of CLI commands whose decisions are pure elsewhere.

`explain` reads the cluster and asks `gangctl.policy.explain`; `policy_apply` server-side applies what
`gangctl.policy.quota_*` translates; `demo` runs the two-gang demo on `gangctl.cluster`. `gangctl.cli`
only parses arguments and prints.
"""
