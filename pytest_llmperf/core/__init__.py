"""The bottom layer: errors, numbers, tables, the metric catalog, traces, workloads, settings, fingerprints."""
