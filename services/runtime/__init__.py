"""What every service stands on: NATS connection, consumer loop, telemetry, configuration."""
