"""Kubernetes' rules for names and labels, and cptest's names for what it renders.

The API server enforces these; an offline schema cannot (a name is just a string in the OpenAPI
schemas), so the renderer builds valid names and `validate` checks them again.
"""

from __future__ import annotations

import hashlib
import re

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""RFC 1035 label: what a Service name must be (and what a LeaderWorkerSet name is used as: LWS
names its own headless Service after itself)."""
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""RFC 1123 subdomain: a PersistentVolumeClaim's name."""
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_VALUE_MAX = 63
LWS_NAME_MAX = 40
"""LWS names pods `<name>-<group>-<worker>` and StatefulSets `<name>` and `<name>-<group>`; the
controller-revision-hash label `<statefulset>-<10 chars>` must stay within 63 characters."""

PREFIX = "cptest/"
"""Label and annotation keys cptest sets (`cptest/scenario`, `cptest/role`, `cptest/plan`)."""


def dns_label(text: str, limit: int = LWS_NAME_MAX) -> str:
    """`text` as an RFC 1035 label of at most `limit` characters: lower case, runs of anything else
    than [a-z0-9] become one `-`; a name cut short ends with 8 hex of the whole text's sha256, so two
    long names that share a beginning stay apart."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"
    if not name[0].isalpha():
        name = f"s-{name}"
    if len(name) > limit:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        name = f"{name[: limit - 9].rstrip('-')}-{digest}"
    return name


def label_value(text: str) -> str:
    """`text` as a label value: as it is when it is one, else its RFC 1035 form."""
    if len(text) <= LABEL_VALUE_MAX and LABEL_VALUE.match(text):
        return text
    return dns_label(text, LABEL_VALUE_MAX)


def name_problems(kind: str, name: object) -> list[str]:
    """What is wrong with `name` as the metadata.name of a `kind` cptest renders (empty: nothing)."""
    if not isinstance(name, str):
        return [f"{kind} name {name!r} is not a string"]
    limit = LWS_NAME_MAX if kind == "LeaderWorkerSet" else 63
    if len(name) > limit or not DNS_LABEL.match(name):
        return [f"{kind} name {name!r} is not an RFC 1035 label of at most {limit} characters"]
    return []


def label_problems(where: str, labels: object) -> list[str]:
    """What is wrong with the label values of `labels` (keys are cptest's own or LWS's)."""
    if not isinstance(labels, dict):
        return []
    return [f"{where}: label {k} value {v!r} is not a label value (63 characters of [A-Za-z0-9_.-], "
            "alphanumeric at both ends)"
            for k, v in labels.items()
            if not isinstance(v, str) or len(v) > LABEL_VALUE_MAX or not LABEL_VALUE.match(v)]
