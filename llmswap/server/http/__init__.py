"""The connection and request layer under every route: connections, the middleware, origins and
Host, keys, errors."""
