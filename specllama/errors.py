"""Domain errors. The CLI turns each into a one-line message at one boundary."""

from __future__ import annotations


class SpecLlamaError(Exception):
    """Base class: a problem the user can fix, reported without a traceback."""

    exit_code = 2


class ConfigError(SpecLlamaError):
    """models.toml is missing, malformed, or names something that does not exist."""


class ModelLoadError(SpecLlamaError):
    """A GGUF file is missing, unreadable, or llama.cpp refused it."""


class IncompatiblePairError(SpecLlamaError):
    """Target and draft do not share a vocabulary, so drafts cannot be verified."""


class ContextOverflowError(SpecLlamaError):
    """The prompt (plus what must be generated) does not fit the context window."""


class InvalidParameterError(SpecLlamaError):
    """A sampling or speculation setting is out of range."""


class DraftDerivationError(SpecLlamaError):
    """A derived draft (requantized target) could not be created."""


class RpcError(SpecLlamaError):
    """An RPC server (a remote target's device) is unreachable, busy or incompatible,
    or this llama.cpp build has no RPC backend."""


class DecodeError(SpecLlamaError):
    """llama.cpp failed to decode a batch (llama_decode returned an error), for a reason
    other than a full KV cache. Not a user mistake; reported in one line all the same."""

    exit_code = 1


class KVCacheError(SpecLlamaError):
    """llama.cpp refused to cut a KV cache back: continuing would silently stop being exact.
    Not a user mistake; reported in one line all the same."""

    exit_code = 1


class ConstraintError(SpecLlamaError):
    """A JSON schema, grammar or regex is malformed, unreadable or unsupported."""
