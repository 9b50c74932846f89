"""Probes: read an inference system (vLLM /metrics, NVML, queues) and turn readings into numbers.

The workload capture (``workload_capture``, ``prometheus_capture``, ``gateway_capture``) reads
the same /metrics into a workload shape (bot/adr/workload/)."""
