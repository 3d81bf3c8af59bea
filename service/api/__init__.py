"""The HTTP API: app factory, dependencies, routers per resource, and schemas."""
