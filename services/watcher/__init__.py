"""The watcher: Proxy custom resources into the event log, and the log back into their status."""
