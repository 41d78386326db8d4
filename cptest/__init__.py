"""cptest: qualify SGLang context parallelism with rank-local evidence."""

__version__ = "0.1.0"
