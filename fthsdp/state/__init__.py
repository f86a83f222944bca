"""The training state: what travels with catch-up and checkpoints, how it is served, fetched and digested."""
