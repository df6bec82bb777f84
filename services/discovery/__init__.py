"""The discovery API: lists proxies and leases them out, over HTTP (Litestar on uvicorn)."""
