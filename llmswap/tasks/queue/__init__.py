"""The durable task queue of the server: SQLite rows, lanes per type, the service on the router."""
