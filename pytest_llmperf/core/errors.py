"""User-facing errors: each carries a one-line message that says what to do."""


class LLMPerfError(Exception):
    """A problem the user can fix (bad model path, bad marker key, context too small...).

    The plugin shows ``str(error)`` as a single line, without a traceback.
    """


class ConfigError(LLMPerfError):
    """Invalid configuration: options, ini settings, marker keys."""


class EngineError(LLMPerfError):
    """The engine could not load the model or run the workload."""


class NotSteppable(EngineError):
    """A run could not pause between its tokens (``engines.capabilities.SteppedRuns``): the
    engine computed while paused, or nothing shows that it did not. Runs of whole requests
    serve instead."""


class ToolBuildError(EngineError):
    """llama.cpp's own tools (llama-server, llama-bench) could not be built or found."""
