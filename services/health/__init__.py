"""Health prober: probes every Ready proxy through itself and records verdict changes."""
