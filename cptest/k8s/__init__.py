"""Kubernetes manifests of a plan: one LeaderWorkerSet and its leader's Service per server.

`cptest compile FILE --target lws` renders them (`render.render`), `yaml_text.dump` writes them as
multi-document YAML, and `validate` checks them offline: the core kinds against the schemas
kubernetes-validate bundles for a pinned Kubernetes version, the LeaderWorkerSet against the
structural schema of its published API version (`schemas/leaderworkerset-v1.json`). No API server
runs here, so nothing is ever applied (docs/kubernetes.md).
"""
