"""A launch that failed for a reason that is not the engine's behaviour, read from its own log.

Preflight (`cptest.run.preflight`) catches these before launch where it can; what it cannot see
(a port taken between its check and the engine's bind, a file removed in between, a disk that
filled during start-up) shows in the failed server's log. When a server's launch failed and its
log or launch reason carries one of these signatures, the archive's verdicts say unknown with the
cause instead of the failures the missing run would produce (`checks.check_loaded`).

The signatures are the operating system's and Python's own texts, which SGLang and the reference
engine print unchanged in the traceback that ends them: EADDRINUSE and ENOSPC as `strerror` gives
them (and SGLang's `<port name> at <port> is not available in <n> seconds`), a missing checkpoint
file as `FileNotFoundError` or transformers' `does not appear to have a file named config.json`
(AutoConfig, which the pinned SGLang release loads the model's config with).

A package the install lacks (`package_missing`) counts only when Python's `ImportError` or
`ModuleNotFoundError` is the last exception the log prints: SGLang logs import errors it ignores (a
model module whose optional dependency is absent) in every start-up, and an import error handled on
the way to another exception is that other exception's failure. A backend whose kernels live in an
optional package (FlashAttention 4 needs the CuTe DSL, imported as `cutlass`) ends this way when the
install has no such package: that is the install's gap, not the engine's behaviour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cptest.evidence import Evidence

SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # SGLang's own check before it binds a derived port (utils/network.py:74-94, wait_port_available):
    # on one host, co-located nodes of an attention-DP server derive the same ports, and a node that
    # checks after the first node bound them ends here.
    ("port_in_use", re.compile(r"Address already in use|\b\w+ at \d+ is not available in \d+ seconds")),
    ("disk_full", re.compile(r"No space left on device")),
    ("model_missing", re.compile(r"No such file or directory: '[^']*(?:config\.json|\.safetensors|\.bin)'"
                                 r"|does not appear to have a file named config\.json")),
    ("package_missing", re.compile(r"^(?:ImportError|ModuleNotFoundError): [^\n]*$"
                                   r"(?![\s\S]*^[\w.]+(?:Error|Exception|Interrupt)\b)", re.M)),
)


@dataclass(frozen=True)
class LaunchCause:
    role: str
    code: str
    line: str

    def describe(self) -> str:
        return (f"the {self.role} server did not launch for a reason that is not the engine's behaviour "
                f"({self.code}): {self.line}")


def launch_cause(evidence: Evidence, roles: list[str]) -> LaunchCause | None:
    """The first server of `roles` whose launch failed with an infrastructure signature, if any."""
    for role in roles:
        ev = evidence.role(role)
        if ev.runner is None:
            continue
        failed = ev.runner.events("launch_failed")
        if not failed or ev.runner.events("ready"):
            continue
        text = str(failed[0].detail.get("reason", "")) + "\n" + ev.log_text
        for code, pattern in SIGNATURES:
            m = pattern.search(text)
            if m:
                line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()
                return LaunchCause(role, code, line[:300])
    return None
