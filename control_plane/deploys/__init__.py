"""deploys."""
