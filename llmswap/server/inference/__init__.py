"""The inference routes and what they need: resolving the model, profiles, selectors, peers, the
forwarder, loading feedback, cancels."""
