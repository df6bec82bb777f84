"""The operator's console: read-only HTML pages of the fleet, served by discovery under ``/ui``."""

from services.discovery.console.router import console_router

__all__ = ["console_router"]
