"""ASGI middleware for what every protected route shares: the bearer token, the request
log line and the protocol's error answers. app.py puts them on the routes that need them."""
