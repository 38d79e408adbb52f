"""Tools: the integration catalogue, the HTTP sender and the idempotency rules."""
