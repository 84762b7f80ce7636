"""ASGI middleware for what the routes share: the bearer token, the request log line and
the protocol's error answers, one module each. app.py puts each on the routes that need it."""
