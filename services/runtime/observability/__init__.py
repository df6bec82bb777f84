"""What an operator sees of every service: structured logs, Prometheus metrics, OpenTelemetry
spans.
"""
