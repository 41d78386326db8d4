"""Code that runs inside SGLang ranks and writes rank-local evidence (see `runtime` for the contract).

Entry points: `plugin.register` (the `sglang.srt.plugins` entry point) and the `--forward-hooks`
factories in `forward_hooks`. The probe is inert unless `CPTEST_PROBE_DIR` is set.
"""
