"""The pytest wiring: hooks, the llmperf fixture and marker, options."""
