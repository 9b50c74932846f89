"""Probes: read an inference system (vLLM /metrics, NVML, queues) and turn readings into numbers."""
