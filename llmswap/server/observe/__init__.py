"""What the server shows about itself: events, metrics, activity, performance, logs, the status page."""
