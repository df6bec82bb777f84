"""The microservices, the runtime they share, and the CLI."""
